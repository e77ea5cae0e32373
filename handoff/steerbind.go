package handoff

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// An auto listener (BalanceAuto, the default of an app whose binds the
// agent answers) serves as a shared socket until a worker binds its
// address itself; from then on its workers get sockets of their own, as
// with balance "even". Its socket is listening, with SO_REUSEPORT, in a
// reuseport group with the steering program attached and no slot active,
// so that the kernel gives every connection to it alone: an app that takes
// fd 3 shares it as it would a plain socket. The bind that the agent
// answers with a socket of the group (Member) turns the steering on
// (SteerOnBind): the shared socket stops listening, its queue moves to the
// member (the program's request migration), and the supervisor puts each
// worker's own socket in the steering map, so that a stopping worker can
// be taken out of the rotation and let run dry before its stop signal.
// Whether it is on is the socket's own state (not listening), which the
// next agent reads after an upgrade.

// listenShared makes the auto listener's anchor listen, in the mode the
// app asked (nonblocking), with the program attached to its group.
func (l *Listener) listenShared(nonblocking bool) error {
	fd := int(l.fd)
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return fmt.Errorf("listen %s %s: %w", l.Network, l.Address, err)
	}
	if err := unix.SetNonblock(fd, nonblocking); err != nil {
		return fmt.Errorf("O_NONBLOCK %s %s: %w", l.Network, l.Address, err)
	}
	return l.steered.Group.Attach(l.fd)
}

// SteerOnBind turns an auto listener's steering on, once a worker's bind
// took a socket of its own from Member: the shared socket stops listening
// for every process that holds it (shutdown(2)), and the connections
// waiting in it move to the group's listening sockets. It reports whether
// this call turned it on; false for any other listener. Safe for
// concurrent use.
func (l *Listener) SteerOnBind() bool {
	s := l.steered
	if s == nil || !s.onBind || !s.on.CompareAndSwap(false, true) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_ = unix.Shutdown(int(l.fd), unix.SHUT_RD)
	}
	return true
}

// Steerable returns the listener's steering whether or not it is in
// effect yet (an auto listener before a worker bound its address), nil
// for a listener that has none.
func (l *Listener) Steerable() *Steered { return l.steered }

// acceptsConnections reports whether the socket fd listens (SO_ACCEPTCONN).
func acceptsConnections(fd uintptr) bool {
	v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	return err == nil && v != 0
}
