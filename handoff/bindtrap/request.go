package bindtrap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Request is a bind a worker (or a process it started) asked for.
type Request struct {
	PID    int            // the calling thread, in the agent's pid namespace
	FD     int            // the socket's fd number in the caller
	Family int            // unix.AF_INET or unix.AF_INET6
	Stream bool           // a SOCK_STREAM (TCP) socket
	Addr   netip.AddrPort // as asked; an IPv4-mapped IPv6 address unmapped
}

func (r Request) String() string {
	proto := "udp"
	if r.Stream {
		proto = "tcp"
	}
	return proto + " " + r.Addr.String()
}

// Decision answers a Request.
type Decision struct {
	// Sock, when set, is the socket placed at the caller's fd: the bind
	// returns 0 and the app uses the agent's socket from then on.
	Sock syscall.Conn
	// Errno, with Sock nil, refuses the bind with this error; 0 lets the
	// bind run as the app asked, as its own uid.
	Errno syscall.Errno
	// Refused, with Errno, says for a person why and what to do: the
	// worker's status and its not-ready error carry it.
	Refused string
	// Name says what Sock is, for status and the log.
	Name string
	// Placed, when set, is called once Sock is at the caller's fd (before
	// the caller's bind returns); Unused, when Sock could not be placed.
	Placed, Unused func()
}

// Decide is the agent's policy: which bind gets which socket. It is called
// from the Trap's goroutine, one call at a time per Trap, and must not
// block for long: the app waits in its bind meanwhile.
type Decide func(Request) Decision

// errGone: the notification is no longer live (the caller was killed, or
// its pid may already be another process's).
var errGone = errors.New("bindtrap: the caller is gone")

// readRequest reads a bind's arguments from the caller. ok is false for a
// bind to a family the trap does not answer (unix, netlink, ...): those run
// as asked.
func readRequest(nf *os.File, n *notif) (Request, bool, error) {
	r := Request{PID: int(n.PID), FD: int(int32(n.Data.Args[0]))}
	size := min(n.Data.Args[2], unix.SizeofSockaddrInet6)
	buf := make([]byte, size)
	mem, err := os.Open("/proc/" + strconv.Itoa(r.PID) + "/mem")
	if errors.Is(err, fs.ErrNotExist) {
		return r, false, fmt.Errorf("%w: %w", errGone, err)
	}
	if err != nil { // no ptrace rights over it (Yama, a non-root agent): it runs as asked
		return r, false, err
	}
	got, err := mem.ReadAt(buf, int64(n.Data.Args[1]))
	mem.Close()
	if err != nil || got < 2 {
		return r, false, nil // a bad pointer: the bind fails by itself (EFAULT)
	}
	// The pid was live when the memory was read only if the notification
	// still is (pid reuse).
	if err := idValid(nf, n.ID); err != nil {
		return r, false, err
	}
	r.Family = int(binary.NativeEndian.Uint16(buf))
	switch {
	case r.Family == unix.AF_INET && got >= unix.SizeofSockaddrInet4:
		ip := netip.AddrFrom4([4]byte(buf[4:8]))
		r.Addr = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(buf[2:4]))
	case r.Family == unix.AF_INET6 && got >= unix.SizeofSockaddrInet6:
		ip := netip.AddrFrom16([16]byte(buf[8:24])).Unmap()
		r.Addr = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(buf[2:4]))
	default:
		return r, false, nil
	}
	typ, err := socketType(r.PID, r.FD)
	if err != nil {
		return r, false, err
	}
	r.Stream = typ == unix.SOCK_STREAM
	return r, true, nil
}

// socketType asks the kernel for the type of the caller's socket (a copy
// through pidfd_getfd, closed at once).
func socketType(tid, fd int) (int, error) {
	pfd, err := unix.PidfdOpen(tid, unix.PIDFD_THREAD)
	if err != nil {
		pfd, err = unix.PidfdOpen(tid, 0) // before Linux 6.9: works for a leader
	}
	if err == unix.ESRCH {
		return 0, fmt.Errorf("%w: pidfd_open %d: %w", errGone, tid, err)
	}
	if err != nil {
		return 0, fmt.Errorf("pidfd_open %d: %w", tid, err)
	}
	defer unix.Close(pfd)
	sfd, err := unix.PidfdGetfd(pfd, fd, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_getfd %d fd %d: %w", tid, fd, err)
	}
	defer unix.Close(sfd)
	return unix.GetsockoptInt(sfd, unix.SOL_SOCKET, unix.SO_TYPE)
}

// fdFlags returns the caller's fd's close-on-exec flag and O_NONBLOCK
// (the flags line of /proc/TID/fdinfo/FD), so that the socket put in its
// place keeps the app's choices. Unknown: close-on-exec, non-blocking
// (what Go, tokio and libuv make).
func fdFlags(tid, fd int) (cloexec, nonblock bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return true, true
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("flags:")); ok {
			flags, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 64)
			if err != nil {
				return true, true
			}
			return flags&unix.O_CLOEXEC != 0, flags&unix.O_NONBLOCK != 0
		}
	}
	return true, true
}
