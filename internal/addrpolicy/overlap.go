package addrpolicy

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Address families a TCP address takes.
const (
	famV4 = 1 << iota
	famV6
)

// Overlap reports whether a and b cannot both be bound: the same unix
// path, or the same TCP port in a common address family on the same host
// or where either is every interface. Hosts that are not IP literals
// compare by name.
func Overlap(a, b Addr) bool {
	if (a.Network == "unix") != (b.Network == "unix") {
		return false
	}
	if a.Network == "unix" {
		return a.Address == b.Address
	}
	ha, hb := hostOf(a), hostOf(b)
	return portOf(a) == portOf(b) && families(a.Network, ha)&families(b.Network, hb) != 0 &&
		(sameHost(ha, hb) || wildcard(ha) || wildcard(hb))
}

// families are the address families a TCP address of network on host takes.
func families(network, host string) byte {
	switch addr, err := netip.ParseAddr(host); {
	case network == "tcp4":
		return famV4
	case network == "tcp6":
		return famV6
	case err == nil && !addr.IsUnspecified() && addr.Unmap().Is4():
		return famV4
	case err == nil && !addr.IsUnspecified():
		return famV6
	}
	return famV4 | famV6
}

// wildcard reports whether a TCP host means every interface.
func wildcard(host string) bool {
	addr, err := netip.ParseAddr(host)
	return host == "" || err == nil && addr.IsUnspecified()
}

func sameHost(a, b string) bool {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX == nil && errY == nil {
		return x.Unmap() == y.Unmap()
	}
	return strings.EqualFold(a, b)
}

func hostOf(a Addr) string {
	h, _, _ := net.SplitHostPort(a.Address)
	return h
}

// portOf is a TCP address's port, 0 when it has none.
func portOf(a Addr) int {
	_, p, err := net.SplitHostPort(a.Address)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}
