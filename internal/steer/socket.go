package steer

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Anchor returns a TCP socket bound to address with SO_REUSEPORT that does
// not listen: it keeps the address (and a port 0's choice) for the group's
// listening sockets, is never in the group itself, so no connection can
// wait on it, and crosses an agent handoff as the address's listener.
func Anchor(network, address string) (*os.File, error) {
	addr, err := net.ResolveTCPAddr(network, address)
	if err != nil {
		return nil, fmt.Errorf("steer: %s %s: %w", network, address, err)
	}
	family, sa, v6only := sockaddr(network, addr)
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("steer: socket: %w", err)
	}
	if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err == nil {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}
	if err == nil && family == unix.AF_INET6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only)
	}
	if err == nil {
		err = unix.Bind(fd, sa)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("steer: bind %s %s: %w", network, address, err)
	}
	return os.NewFile(uintptr(fd), "deployd-anchor:"+network+":"+address), nil
}

// sockaddr chooses the family as Go's net package does for a listener: a
// wildcard address of "tcp" is a dual-stack IPv6 socket.
func sockaddr(network string, a *net.TCPAddr) (int, unix.Sockaddr, int) {
	wildcard := a.IP == nil || a.IP.IsUnspecified()
	if ip4 := a.IP.To4(); network == "tcp4" || (ip4 != nil && !(wildcard && network == "tcp")) {
		sa := &unix.SockaddrInet4{Port: a.Port}
		if ip4 != nil {
			copy(sa.Addr[:], ip4)
		}
		return unix.AF_INET, sa, 0
	}
	sa := &unix.SockaddrInet6{Port: a.Port}
	if !wildcard {
		copy(sa.Addr[:], a.IP.To16())
	}
	v6only := 0
	if network == "tcp6" {
		v6only = 1
	}
	return unix.AF_INET6, sa, v6only
}

// Listen opens a listening socket in the reuseport group of address (the
// anchor's bound address, its port resolved) with the program attached:
// the caller puts it in a slot once its worker is ready. The descriptor is
// close-on-exec and blocking.
func (g *Group) Listen(network, address string) (*os.File, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err == nil {
			err = serr
		}
		return err
	}}
	// Go's listeners are Multipath TCP where the kernel has it; an MPTCP
	// socket takes no sk_reuseport program.
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), network, address)
	if err != nil {
		return nil, fmt.Errorf("steer: listen %s %s in the reuseport group: %w", network, address, err)
	}
	defer ln.Close()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return nil, err
	}
	var dup int
	var derr error
	if err := raw.Control(func(fd uintptr) {
		if derr = g.Attach(fd); derr == nil {
			dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3)
		}
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	if err := unix.SetNonblock(dup, false); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("steer: clear O_NONBLOCK: %w", err)
	}
	return os.NewFile(uintptr(dup), "deployd-member:"+network+":"+address), nil
}
