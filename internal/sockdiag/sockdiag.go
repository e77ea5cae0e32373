// Package sockdiag lists the kernel's TCP sockets over NETLINK_SOCK_DIAG
// (inet_diag, the interface ss(8) reads): each socket's state, ends,
// queues, owner and inode, without parsing /proc/net/tcp.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// State is a TCP state as the kernel numbers it (include/net/tcp_states.h).
type State uint8

// The TCP states a dump may ask for.
const (
	Established State = 1
	SynSent     State = 2
	SynRecv     State = 3
	FinWait1    State = 4
	FinWait2    State = 5
	TimeWait    State = 6
	Close       State = 7
	CloseWait   State = 8
	LastAck     State = 9
	Listen      State = 10
	Closing     State = 11
)

// Socket is one TCP socket.
type Socket struct {
	State         State
	Local, Remote netip.AddrPort
	// RecvQ and SendQ are the queues: bytes not read and not acknowledged;
	// for a listener, the connections in its accept queue and its backlog.
	RecvQ, SendQ uint32
	UID          uint32
	// Inode is the socket's inode: /proc/PID/fd/N links to
	// "socket:[Inode]" in the processes that hold it.
	Inode uint64
	// Info is the connection's tcp_info, from TCPInfo dumps only (nil
	// otherwise, or where the kernel sent none).
	Info *Info
}

// MaxSockets bounds a dump: a host with more TCP sockets in the states
// asked for gets ErrTooMany rather than an unbounded answer.
const MaxSockets = 1 << 20

// timeout bounds each read of the kernel's answer.
const timeout = 5 * time.Second

// ErrTooMany is returned when a dump passes MaxSockets.
var ErrTooMany = errors.New("sockdiag: more than MaxSockets sockets")

// Sizes of the kernel's structures (linux/netlink.h, linux/inet_diag.h).
const (
	sizeofNlmsghdr     = 16
	sizeofSockID       = 48
	sizeofReqV2        = 8 + sizeofSockID
	sizeofInetDiagMsg  = 4 + sizeofSockID + 20
	sockDiagByFamily   = 20 // SOCK_DIAG_BY_FAMILY
	netlinkReadBufSize = 64 << 10
)

// TCP dumps the TCP sockets, IPv4 and IPv6, whose state is one of states,
// and returns those keep accepts (all of them when keep is nil). Any user
// may dump; the kernel shows every socket of the network namespace.
func TCP(states []State, keep func(*Socket) bool) ([]Socket, error) {
	return dump(states, 0, keep)
}

// TCPInfo is TCP with each socket's tcp_info (INET_DIAG_INFO) in Info.
func TCPInfo(states []State, keep func(*Socket) bool) ([]Socket, error) {
	return dump(states, 1<<(inetDiagInfo-1), keep)
}

// dump is TCP, asking for the extensions in ext (idiag_ext).
func dump(states []State, ext uint8, keep func(*Socket) bool) ([]Socket, error) {
	var mask uint32
	for _, s := range states {
		mask |= 1 << s
	}
	if mask == 0 {
		return nil, errors.New("sockdiag: no TCP state asked for")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sockdiag: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("sockdiag: receive timeout: %w", err)
	}
	var out []Socket
	n := 0
	for i, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		seq := uint32(i + 1)
		if err := unix.Sendto(fd, request(family, ext, mask, seq), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, fmt.Errorf("sockdiag: send the dump request: %w", err)
		}
		err := receive(fd, seq, func(s *Socket) error {
			if n++; n > MaxSockets {
				return ErrTooMany
			}
			if keep == nil || keep(s) {
				out = append(out, *s)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// request is a netlink message asking for a dump of family's TCP sockets
// in the states of mask (struct inet_diag_req_v2), with the extensions
// of ext.
func request(family, ext uint8, mask, seq uint32) []byte {
	b := make([]byte, sizeofNlmsghdr+sizeofReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], sockDiagByFamily)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[sizeofNlmsghdr:]
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	r[2] = ext
	ne.PutUint32(r[4:], mask)
	return b
}

// receive reads the answer to request seq until NLMSG_DONE, calling fn
// for each socket.
func receive(fd int, seq uint32, fn func(*Socket) error) error {
	buf := make([]byte, netlinkReadBufSize)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("sockdiag: read the dump: %w", err)
		}
		for b := buf[:n]; len(b) > 0; {
			if len(b) < sizeofNlmsghdr {
				return errors.New("sockdiag: short netlink header")
			}
			ne := binary.NativeEndian
			l := int(ne.Uint32(b[0:]))
			typ := ne.Uint16(b[4:])
			if l < sizeofNlmsghdr || l > len(b) {
				return fmt.Errorf("sockdiag: netlink message of %d bytes in %d", l, len(b))
			}
			msg := b[sizeofNlmsghdr:l]
			if ne.Uint32(b[8:]) == seq {
				switch typ {
				case unix.NLMSG_DONE:
					return nil
				case unix.NLMSG_ERROR:
					if len(msg) >= 4 {
						if e := int32(ne.Uint32(msg)); e != 0 {
							return fmt.Errorf("sockdiag: dump: %w", unix.Errno(-e))
						}
					}
					return nil
				case sockDiagByFamily:
					s, err := parse(msg)
					if err != nil {
						return err
					}
					if err := fn(&s); err != nil {
						return err
					}
				}
			}
			// Messages are padded to 4 bytes (NLMSG_ALIGN).
			b = b[min((l+3)&^3, len(b)):]
		}
	}
}

// parse reads a struct inet_diag_msg.
func parse(m []byte) (Socket, error) {
	if len(m) < sizeofInetDiagMsg {
		return Socket{}, fmt.Errorf("sockdiag: inet_diag_msg of %d bytes", len(m))
	}
	ne, be := binary.NativeEndian, binary.BigEndian
	id := m[4 : 4+sizeofSockID]
	addr := func(a []byte) netip.Addr {
		if m[0] == unix.AF_INET {
			return netip.AddrFrom4([4]byte(a[:4]))
		}
		return netip.AddrFrom16([16]byte(a[:16]))
	}
	s := Socket{
		State:  State(m[1]),
		Local:  netip.AddrPortFrom(addr(id[4:20]), be.Uint16(id[0:])),
		Remote: netip.AddrPortFrom(addr(id[20:36]), be.Uint16(id[2:])),
		RecvQ:  ne.Uint32(m[56:]),
		SendQ:  ne.Uint32(m[60:]),
		UID:    ne.Uint32(m[64:]),
		Inode:  uint64(ne.Uint32(m[68:])),
	}
	s.Info = parseInfo(m[sizeofInetDiagMsg:])
	return s, nil
}
