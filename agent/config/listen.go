package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/addrpolicy"
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

// allowPorts decodes `allow_ports`: the TCP ports an app without a listen
// list may take when its own code asks for one (addrpolicy).
func (d *decoder) allowPorts(p toml.Primitive, key []string, app *App) {
	entries, ok := get[[]string](d, p, key)
	if !ok {
		return
	}
	ports, err := addrpolicy.ParsePorts(entries)
	if err != nil {
		d.fail(key, fmt.Sprintf("%q", entries), hint(nil, "%v", err))
		return
	}
	app.AllowPorts = ports
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
	l   Listen
	key []string
}

// Addr is l as the address policy sees it.
func (l Listen) Addr() addrpolicy.Addr {
	return addrpolicy.Addr{Network: l.Network, Address: l.Address}
}

func (s socketSite) conflicts(o socketSite) bool { return addrpolicy.Overlap(s.l.Addr(), o.l.Addr()) }

// claim records l for key; it reports a conflict with an earlier address
// (naming both places) and returns false then.
func (d *decoder) claim(key []string, l Listen) bool {
	site := socketSite{l: l, key: key}
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
