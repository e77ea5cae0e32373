package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// maxUnixPath is the longest path a Unix socket address holds (sun_path is
// 108 bytes with the terminating NUL on Linux).
const maxUnixPath = 107

const listenExample = `write e.g. "tcp://0.0.0.0:8080", "tcp://127.0.0.1:9000#admin" or "unix:///run/web.sock"`

// listens decodes and checks the `listen` array of app.
func (d *decoder) listens(p toml.Primitive, key []string, app *App) {
	urls, ok := get[[]string](d, p, key)
	if !ok {
		return
	}
	for _, raw := range urls {
		l, err := parseListen(raw, app.Name, d.dir)
		if err != nil {
			d.fail(key, strconv.Quote(raw), err)
			continue
		}
		if d.claim(key, l) {
			app.Listen = append(app.Listen, l)
		}
	}
}

// DiscoveredListen is the listener of an app without a listen list, at the
// address its own listen(port) asked for (raw: tcp://HOST:PORT or
// unix:///PATH).
func DiscoveredListen(raw, app string) (Listen, error) {
	l, err := parseListen(raw, app, "/")
	l.Discovered = true
	return l, err
}

// parseListen parses one listen URL; dir resolves relative unix paths.
func parseListen(raw, app, dir string) (Listen, error) {
	rest, name, hasName := strings.Cut(raw, "#")
	l := Listen{URL: raw, Name: app}
	if hasName {
		if err := checkFDName(name); err != nil {
			return l, err
		}
		l.Name = name
	}
	scheme, addr, ok := strings.Cut(rest, "://")
	if strings.TrimSpace(rest) == "" || !ok {
		return l, hint(nil, "not a listen URL (scheme://address); %s", listenExample)
	}
	if strings.Contains(addr, "?") {
		return l, hint(nil, "query strings are not supported; remove the ?... part; %s", listenExample)
	}
	l.Network = strings.ToLower(scheme)
	switch l.Network {
	case "unix":
		return l, parseUnix(&l, addr, dir)
	case "tcp", "tcp4", "tcp6":
		return l, parseTCP(&l, addr)
	}
	return l, hint(nil, "unsupported scheme %q; use tcp://, tcp4://, tcp6:// or unix://; %s", scheme, listenExample)
}

// checkFDName checks a LISTEN_FDNAMES entry (systemd: printable ASCII, no
// ':', at most 255 characters).
func checkFDName(name string) error {
	bad := name == "" || len(name) > 255 || strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || r == ':'
	})
	if bad {
		return hint(nil, "bad name after #: use 1-255 printable characters without spaces or ':', e.g. #admin")
	}
	return nil
}

func parseUnix(l *Listen, path, dir string) error {
	if path == "" {
		return hint(nil, "missing socket path; write e.g. \"unix:///run/web.sock\" or \"unix://web.sock\" (relative to the config folder)")
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	l.Address = filepath.Clean(path)
	if len(l.Address) > maxUnixPath {
		return hint(nil, "socket path %s is %d bytes, Unix sockets allow %d; use a shorter path", l.Address, len(l.Address), maxUnixPath)
	}
	return nil
}

func parseTCP(l *Listen, hostport string) error {
	if strings.ContainsAny(hostport, "/@") {
		return hint(nil, "a tcp address is only host:port; %s", listenExample)
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return hint(err, "missing or bad port; write host:port, e.g. \"tcp://0.0.0.0:8080\" (all interfaces) or \"tcp://:8080\"")
	}
	if err := checkPort(port); err != nil {
		return err
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if l.Network == "tcp4" && !addr.Unmap().Is4() || l.Network == "tcp6" && addr.Is4() {
			return hint(nil, "%s does not fit %s; use tcp:// or an address of that family", host, l.Network)
		}
	} else if strings.ContainsAny(host, ":%[] \t") {
		return hint(err, "bad host %q; %s", host, listenExample)
	}
	l.Address = hostport
	return nil
}

func checkPort(port string) error {
	n, err := strconv.Atoi(port)
	switch {
	case err != nil || strings.Trim(port, "0123456789") != "" || n > 65535:
		return hint(err, "bad port %q; use a number from 1 to 65535, e.g. \"tcp://0.0.0.0:8080\"", port)
	case n == 0:
		return hint(nil, "port 0 is not allowed: workers of old and new generations must share one fixed address; pick a port, e.g. \"tcp://0.0.0.0:8080\"")
	}
	return nil
}

// socketSite is an address claimed by a key, for the duplicate check.
type socketSite struct {
	l    Listen
	key  []string
	host string
	port string
	fams byte // address families a tcp listener takes: famV4|famV6
}

const (
	famV4 = 1 << iota
	famV6
)

func newSite(key []string, l Listen) socketSite {
	s := socketSite{l: l, key: key}
	if l.Network == "unix" {
		return s
	}
	s.host, s.port, _ = net.SplitHostPort(l.Address)
	s.fams = famV4 | famV6
	switch addr, err := netip.ParseAddr(s.host); {
	case l.Network == "tcp4":
		s.fams = famV4
	case l.Network == "tcp6":
		s.fams = famV6
	case err == nil && !addr.IsUnspecified() && addr.Unmap().Is4():
		s.fams = famV4
	case err == nil && !addr.IsUnspecified():
		s.fams = famV6
	}
	return s
}

// wildcard reports whether a tcp host means all interfaces.
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

func (s socketSite) conflicts(o socketSite) bool {
	if (s.l.Network == "unix") != (o.l.Network == "unix") {
		return false
	}
	if s.l.Network == "unix" {
		return s.l.Address == o.l.Address
	}
	return s.port == o.port && s.fams&o.fams != 0 &&
		(sameHost(s.host, o.host) || wildcard(s.host) || wildcard(o.host))
}

// claim records l for key; it reports a conflict with an earlier address
// (naming both places) and returns false then.
func (d *decoder) claim(key []string, l Listen) bool {
	site := newSite(key, l)
	for _, o := range d.sockets {
		if !site.conflicts(o) {
			continue
		}
		// Report at the later of the two in the file, naming the earlier.
		first, second := o, site
		if d.ps.lines.find(o.key) > d.ps.lines.find(key) {
			first, second = site, o
		}
		where := fmt.Sprintf("%s (%s:%d)", keyString(first.key), d.ps.file, d.ps.lines.find(first.key))
		d.fail(second.key, strconv.Quote(second.l.URL), hint(nil,
			"address conflicts with %q of %s; an address can be bound only once: use another port or path, or remove one of them",
			first.l.URL, where))
		return false
	}
	d.sockets = append(d.sockets, site)
	return true
}
