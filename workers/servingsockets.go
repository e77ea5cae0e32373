package workers

import (
	"net/netip"

	"github.com/deployd/deployd/internal/sockdiag"
)

// servingInodes are the sockets through which a worker of spec may still
// take connections: its listeners' (listenerInodes) and, for each shared
// TCP listener, every other socket listening on the same address. Those
// are the own sockets of workers a dead agent left in its steering group
// (an agent that adopts them after a SIGKILL serves on one survivor's
// socket, shared, and cannot take the group's program over): the program
// keeps giving them new connections until their worker closes them, so an
// old worker has not stopped accepting while it holds one. On a shared
// listener with no such group, the dump finds the listener alone. A
// steered listener needs none of this: its old workers leave the map
// before they are told to stop (steer.go).
func servingInodes(spec *Spec) map[uint64]bool {
	socks := listenerInodes(spec)
	addrs := map[netip.AddrPort]bool{}
	for _, b := range spec.Listeners {
		if b.Network == "unix" || b.Steered() != nil {
			continue
		}
		if a, err := b.LocalAddr(); err == nil {
			if ap, err := netip.ParseAddrPort(a); err == nil {
				addrs[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = true
			}
		}
	}
	if len(addrs) == 0 {
		return socks
	}
	ls, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(k *sockdiag.Socket) bool {
		return addrs[netip.AddrPortFrom(k.Local.Addr().Unmap(), k.Local.Port())]
	})
	if err != nil {
		return socks // the listeners' own, as before: the dump is a bonus
	}
	for _, k := range ls {
		socks[k.Inode] = true
	}
	return socks
}
