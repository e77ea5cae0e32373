// Package addrpolicy decides whether root may serve an address that an
// app's own code asked to listen on. The code, and the user it runs as,
// are input, never an instruction: the address is accepted only where the
// config allows it. It is the one place this is decided, for every way an
// app's code can ask (the Node.js preload's listen(port) in a discovery
// run, a bind the agent answers for any runtime).
//
// The rule: an address the app's listen list names is accepted (as that
// listener); an app whose config names none may have a TCP port within its
// allowed ports (allow_ports; by default 1024-65535) that no other app or
// the agent's own settings name and no other process listens on. A unix
// socket path is never accepted from the code: root does not create a file
// where an app's user chose, so such a path must be in the config.
package addrpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Addr is a socket address: Network "tcp", "tcp4", "tcp6" or "unix";
// Address host:port for TCP (host may be empty: every interface), an
// absolute path for unix.
type Addr struct {
	Network, Address string
}

// String is the address as a listen URL: tcp://HOST:PORT or unix:///PATH.
func (a Addr) String() string { return a.Network + "://" + a.Address }

// Use is an address the config gives someone: Owner says who, for a
// refusal ("app web", "[agent] metrics").
type Use struct {
	Owner string
	Addr  Addr
}

// Request is one address an app's code asked for, with what the decision
// needs to know of the config.
type Request struct {
	App string
	// Listen is the app's own listen list (empty for an app whose address
	// is learned from its code).
	Listen []Addr
	// Asked is the address the code asked for.
	Asked Addr
	// Others are every address of the config that is not App's: other
	// apps' listen lists and discovered addresses, the agent's own.
	Others []Use
	// Ports are the TCP ports App's code may ask for without a listen
	// list (allow_ports); nil means DefaultPorts.
	Ports []PortRange
	// Held are the addresses the agent already serves for App (its
	// current listeners): a socket on one of them is App's own, not
	// another process's.
	Held []Addr
}

// Reason is why an address was refused.
type Reason string

// Reasons of a refusal.
const (
	Malformed  Reason = "malformed"   // not an address at all
	NotListed  Reason = "not-listed"  // the app has a listen list without it
	UnixPath   Reason = "unix-path"   // a unix socket path the config does not name
	PortDenied Reason = "port-denied" // a port outside allow_ports
	OtherOwner Reason = "other-owner" // another app (or the agent) has it in the config
	HeldBy     Reason = "held"        // another process listens on it
	Unknown    Reason = "unknown"     // the kernel could not be asked
)

// ErrRefused matches (errors.Is) every *RefusedError.
var ErrRefused = errors.New("addrpolicy: address refused")

// RefusedError is an address an app's code asked for that the config does
// not allow. Nothing was bound for it.
type RefusedError struct {
	App    string
	Asked  string // as the code reported it
	Reason Reason
	// By is who has the address: "app web" (its config names it),
	// "nginx (pid 812) listens on 0.0.0.0:80"; "" when nobody.
	By string
	// Why says what is wrong, Fix what to do, for a person.
	Why, Fix string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("app %s asked to listen on %s, %s; refused (nothing was bound): %s", e.App, e.Asked, e.Why, e.Fix)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Decide returns the listener to serve for r.Asked: the entry of r.Listen
// it names, or r.Asked itself where the rule allows it; otherwise a
// *RefusedError. It asks the kernel (sock_diag) which sockets listen.
func Decide(r Request) (Addr, error) { return decide(r, kernelListeners) }

// listenersFunc describes the listening TCP sockets that overlap a, but
// for those on an address of skip; (nil, nil) when none.
type listenersFunc func(a Addr, skip []Addr) ([]string, error)

func decide(r Request, listeners listenersFunc) (Addr, error) {
	refuse := func(reason Reason, by, why, fix string) (Addr, error) {
		return Addr{}, &RefusedError{App: r.App, Asked: r.Asked.String(), Reason: reason, By: by, Why: why, Fix: fix}
	}
	asked, err := Normalize(r.Asked)
	if err != nil {
		return refuse(Malformed, "", "which is not an address ("+err.Error()+")",
			fmt.Sprintf(`listen on a port, or set listen = ["tcp://0.0.0.0:PORT"] in [apps.%s]`, r.App))
	}
	if len(r.Listen) > 0 {
		if l, ok := match(r.Listen, asked); ok {
			return l, nil
		}
		return refuse(NotListed, "", "which is not in its listen list ("+list(r.Listen)+")",
			fmt.Sprintf(`add it to the listen list of [apps.%s] (e.g. listen = [%q]), or listen where the list says`,
				r.App, suggest(asked)))
	}
	if asked.Network == "unix" {
		return refuse(UnixPath, "", "a unix socket path its config does not name (root creates no socket file where an app's code chooses)",
			fmt.Sprintf(`to serve it, root adds listen = [%q] to [apps.%s], in a folder the app's user cannot write`, asked.String(), r.App))
	}
	port := portOf(asked)
	ports := r.Ports
	if ports == nil {
		ports = DefaultPorts
	}
	if !InRanges(ports, port) {
		why := fmt.Sprintf("port %d, outside the ports it may take (%s)", port, FormatRanges(ports))
		if port < 1024 {
			why = fmt.Sprintf("port %d, a privileged port (below 1024) outside the ports it may take (%s)", port, FormatRanges(ports))
		}
		return refuse(PortDenied, "", why, fmt.Sprintf(`listen on an allowed port, or root allows it in [apps.%s] with allow_ports = ["%d"] or sets listen = [%q]`,
			r.App, port, asked.String()))
	}
	for _, u := range r.Others {
		if Overlap(u.Addr, asked) {
			return refuse(OtherOwner, u.Owner, fmt.Sprintf("which %s has in the config (%s); an address serves one app only", u.Owner, u.Addr),
				fmt.Sprintf(`listen on a port no other app uses, or give [apps.%s] its own listen = ["tcp://0.0.0.0:PORT"]`, r.App))
		}
	}
	holders, err := listeners(asked, r.Held)
	if err != nil {
		return refuse(Unknown, "", "which could not be checked against the sockets that listen ("+err.Error()+")",
			fmt.Sprintf(`set listen = [%q] in [apps.%s]`, asked.String(), r.App))
	}
	if len(holders) > 0 {
		return refuse(HeldBy, holders[0], "which is taken: "+holders[0],
			fmt.Sprintf(`stop that process, or make app %s listen on a free port (or set its listen list)`, r.App))
	}
	return asked, nil
}

// Normalize checks a and returns it cleaned: a known network, an IP
// literal (or no host) and a port 1-65535 for TCP, an absolute path for
// unix.
func Normalize(a Addr) (Addr, error) {
	switch a.Network {
	case "unix":
		if !filepath.IsAbs(a.Address) || strings.ContainsRune(a.Address, 0) {
			return a, errors.New("a unix socket needs an absolute path")
		}
		a.Address = filepath.Clean(a.Address)
		return a, nil
	case "tcp", "tcp4", "tcp6":
	default:
		return a, fmt.Errorf("unknown network %q", a.Network)
	}
	host, port, err := net.SplitHostPort(a.Address)
	if err != nil {
		return a, err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "" {
		return a, fmt.Errorf("bad port %q", port)
	}
	if host != "" {
		ip, err := netip.ParseAddr(host)
		if err != nil || ip.Zone() != "" {
			return a, fmt.Errorf("host %q is not an IP address", host)
		}
		host = ip.Unmap().String()
	}
	a.Address = net.JoinHostPort(host, strconv.Itoa(n))
	return a, nil
}

// Parse reads an address as a listen URL: tcp://HOST:PORT, tcp4://,
// tcp6:// or unix:///PATH, normalized.
func Parse(raw string) (Addr, error) {
	network, address, ok := strings.Cut(raw, "://")
	if !ok {
		return Addr{}, fmt.Errorf("%q is not a listen URL (tcp://HOST:PORT or unix:///PATH)", raw)
	}
	return Normalize(Addr{Network: network, Address: address})
}

// match returns the entry of listen that asked names: a unix socket by
// path, a TCP one by port (one with the same host first), as the Node.js
// preload maps a listen(port) onto an inherited socket.
func match(listen []Addr, asked Addr) (Addr, bool) {
	found := -1
	for i, l := range listen {
		if (l.Network == "unix") != (asked.Network == "unix") {
			continue
		}
		if l.Network == "unix" {
			if filepath.Clean(l.Address) == asked.Address {
				return l, true
			}
			continue
		}
		if portOf(l) != portOf(asked) {
			continue
		}
		if found < 0 || sameHost(hostOf(l), hostOf(asked)) {
			found = i
		}
	}
	if found < 0 {
		return Addr{}, false
	}
	return listen[found], true
}

func list(as []Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(slices.Compact(s), ", ")
}

func suggest(a Addr) string {
	if a.Network == "unix" {
		return a.String()
	}
	return "tcp://0.0.0.0:" + strconv.Itoa(portOf(a))
}
