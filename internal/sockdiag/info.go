package sockdiag

import (
	"encoding/binary"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inetDiagInfo is INET_DIAG_INFO, the attribute that carries struct
// tcp_info (linux/inet_diag.h).
const inetDiagInfo = 2

// Info is what a connection's tcp_info tells about its traffic: enough to
// tell a connection whose peer waits for an answer from an idle one.
type Info struct {
	// LastDataSent and LastDataRecv are how long ago the socket last sent
	// and received data (the kernel counts in jiffies: a few ms apart may
	// read as equal). A connection that received nothing yet counts from
	// its establishment.
	LastDataSent, LastDataRecv time.Duration
	// DataSegsOut counts the data segments the socket sent: 0 for one
	// that never answered anything.
	DataSegsOut uint32
	// BytesReceived counts the bytes its peer sent.
	BytesReceived uint64
}

// Offsets in struct tcp_info (linux/tcp.h), as x/sys/unix lays it out.
var (
	offLastDataSent  = int(unsafe.Offsetof(unix.TCPInfo{}.Last_data_sent))
	offLastDataRecv  = int(unsafe.Offsetof(unix.TCPInfo{}.Last_data_recv))
	offBytesReceived = int(unsafe.Offsetof(unix.TCPInfo{}.Bytes_received))
	offDataSegsOut   = int(unsafe.Offsetof(unix.TCPInfo{}.Data_segs_out))
)

// parseInfo finds INET_DIAG_INFO among the attributes that follow an
// inet_diag_msg; nil when there is none or it is too short to hold the
// fields of Info (a kernel older than 4.6).
func parseInfo(attrs []byte) *Info {
	ne := binary.NativeEndian
	for len(attrs) >= 4 {
		l, typ := int(ne.Uint16(attrs[0:])), ne.Uint16(attrs[2:])
		if l < 4 || l > len(attrs) {
			return nil
		}
		if typ == inetDiagInfo {
			b := attrs[4:l]
			if len(b) < offDataSegsOut+4 {
				return nil
			}
			ms := func(off int) time.Duration { return time.Duration(ne.Uint32(b[off:])) * time.Millisecond }
			return &Info{
				LastDataSent:  ms(offLastDataSent),
				LastDataRecv:  ms(offLastDataRecv),
				DataSegsOut:   ne.Uint32(b[offDataSegsOut:]),
				BytesReceived: ne.Uint64(b[offBytesReceived:]),
			}
		}
		attrs = attrs[min((l+3)&^3, len(attrs)):]
	}
	return nil
}
