package bindtrap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// InstallAndSend is the shim's part, called on the thread that then execs
// the app (it locks it). It installs the filter, sends the notify fd to the
// agent over the socket at fd sock, and puts the notify fd at number sock in
// its place (not close-on-exec): the worker keeps it for the agent that
// comes after a crash, and the app can never close the agent's copy.
func InstallAndSend(sock int) error {
	runtime.LockOSThread()
	nfd, err := install()
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	if err := unix.Sendmsg(sock, []byte{'n'}, unix.UnixRights(nfd), nil, 0); err != nil {
		return fmt.Errorf("send the notify fd to the agent: %w", err)
	}
	if err := unix.Dup3(nfd, sock, 0); err != nil {
		return fmt.Errorf("keep the notify fd at %d: %w", sock, err)
	}
	return nil
}

// ErrNoNotifyFD is returned by Receive when the shim closed the socket
// without sending the notify fd (it could not install the filter: its
// stderr says why).
var ErrNoNotifyFD = errors.New("bindtrap: the shim sent no notify fd")

// Receive reads the notify fd the shim sends on sock (the agent's end of
// the socketpair), waiting at most timeout. sock is not closed.
func Receive(sock *os.File, timeout time.Duration) (*os.File, error) {
	if err := sock.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("receive the notify fd: %w", err)
	}
	raw, err := sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4))
	var n, oobn int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), make([]byte, 1), oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err != nil {
		return nil, fmt.Errorf("receive the notify fd: %w", err)
	}
	if rerr != nil {
		return nil, fmt.Errorf("receive the notify fd: %w", rerr)
	}
	if n == 0 || oobn == 0 {
		return nil, ErrNoNotifyFD
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("%w: bad control message", ErrNoNotifyFD)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("%w: bad control message", ErrNoNotifyFD)
	}
	return NotifyFile(fds[0])
}

// NotifyFile makes fd, a seccomp notify fd the caller owns, a pollable
// *os.File for Serve.
func NotifyFile(fd int) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("notify fd: %w", err)
	}
	return os.NewFile(uintptr(fd), "seccomp-notify"), nil
}

// Pair is a socketpair for InstallAndSend and Receive: Agent is the agent's
// end (non-blocking, pollable), Child the shim's (its fd number in the
// worker is the one the worker keeps the notify fd at).
func Pair() (agent, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair for the notify fd: %w", err)
	}
	if err := unix.SetNonblock(fds[1], false); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "bindtrap-agent"), os.NewFile(uintptr(fds[1]), "bindtrap-child"), nil
}
