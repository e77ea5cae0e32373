package handoff

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Parcel is one message of a handover channel: a header (JSON) and the fds
// that go with it (a worker's channel ends). Passing them over one unix
// socket (SCM_RIGHTS) rather than one tableflip file each keeps tableflip's
// table from collecting the ends of workers that have since exited.
type Parcel struct {
	Header []byte
	Files  []*os.File
}

// maxParcelFiles bounds the fds of one parcel (SCM_MAX_FD is 253).
const maxParcelFiles = 16

// maxParcel bounds one parcel's header.
const maxParcel = 1 << 20

// NewHandoverChannel returns the two ends of a handover channel (a
// SOCK_SEQPACKET pair: one parcel per message, EOF when the sender closes).
// The sender keeps mine and passes theirs to the next agent.
func NewHandoverChannel() (mine, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("handover channel: %w", err)
	}
	for _, fd := range fds {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, maxParcel+64<<10)
	}
	return os.NewFile(uintptr(fds[0]), "handover"), os.NewFile(uintptr(fds[1]), "handover-peer"), nil
}

// SendParcels writes every parcel, then closes ch (the receiver sees EOF).
// It blocks while the channel is full (the receiver has not read yet) until
// deadline; closing ch from another goroutine ends it too.
func SendParcels(ch *os.File, ps []Parcel, deadline time.Time) error {
	defer ch.Close()
	if err := ch.SetWriteDeadline(deadline); err != nil {
		return err
	}
	raw, err := ch.SyscallConn()
	if err != nil {
		return err
	}
	for i, p := range ps {
		if len(p.Files) > maxParcelFiles || len(p.Header) > maxParcel {
			return fmt.Errorf("handover: parcel %d too large (%d fds, %d bytes)", i, len(p.Files), len(p.Header))
		}
		fds := make([]int, 0, len(p.Files))
		for _, f := range p.Files {
			// Not f.Fd(): that would make the shared file description
			// blocking (golang/go#43894), for the worker's other readers too.
			fd, err := rawFd(f)
			if err != nil {
				return err
			}
			fds = append(fds, int(fd))
		}
		var serr error
		err := raw.Write(func(fd uintptr) bool {
			serr = unix.Sendmsg(int(fd), p.Header, unix.UnixRights(fds...), nil, 0)
			return !errors.Is(serr, unix.EAGAIN)
		})
		runtime.KeepAlive(p.Files) // valid until Sendmsg copied them
		if err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("handover: send parcel %d: %w", i, err)
		}
	}
	return nil
}

// ReceiveParcels reads parcels until the sender closes its end, or until
// deadline. The files of every parcel are the receiver's to close.
func ReceiveParcels(ch *os.File, deadline time.Time) ([]Parcel, error) {
	if err := ch.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	raw, err := ch.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, maxParcel)
	oob := make([]byte, unix.CmsgSpace(maxParcelFiles*4))
	var out []Parcel
	for {
		var n, oobn int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			closeParcels(out)
			return nil, fmt.Errorf("handover: receive: %w", err)
		}
		if n == 0 && oobn == 0 {
			return out, nil // EOF
		}
		p := Parcel{Header: append([]byte(nil), buf[:n]...)}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			closeParcels(out)
			return nil, fmt.Errorf("handover: control message: %w", err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				p.Files = append(p.Files, os.NewFile(uintptr(fd), "handover-fd"))
			}
		}
		out = append(out, p)
	}
}

func closeParcels(ps []Parcel) {
	for _, p := range ps {
		for _, f := range p.Files {
			f.Close()
		}
	}
}
