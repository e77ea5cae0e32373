package bindtrap

import (
	"net/netip"
	"syscall"
)

// Listen is a socket the agent answers binds of its address with.
type Listen struct {
	Addr netip.AddrPort // the socket's own address (a real port, never 0)
	Sock syscall.Conn
	Name string // for status: the listen's name or address
}

// Match is the Decide that answers a TCP bind of a listen's port with that
// listen's socket, and lets every other bind run as asked: UDP, port 0,
// ports no listen names, and an address that names another host than the
// listen's (a wildcard on either side matches: `:8080`, `0.0.0.0:8080`
// and `[::]:8080` all take a listen on 127.0.0.1:8080).
func Match(ls []Listen) Decide {
	return func(r Request) Decision {
		if l, ok := Find(ls, r); ok {
			return Decision{Sock: l.Sock, Name: l.Name}
		}
		return Decision{}
	}
}

// Find returns the listen a TCP bind of r asks for, if any.
func Find(ls []Listen, r Request) (Listen, bool) {
	if !r.Stream || r.Addr.Port() == 0 {
		return Listen{}, false
	}
	for _, l := range ls {
		if l.Addr.Port() != r.Addr.Port() {
			continue
		}
		a, b := r.Addr.Addr(), l.Addr.Addr().Unmap()
		if a.IsUnspecified() || b.IsUnspecified() || a == b {
			return l, true
		}
	}
	return Listen{}, false
}
