package handoff

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenFDsStart is the first descriptor of the socket-activation protocol.
const listenFDsStart = 3

// Activated is a listening socket that systemd (a .socket unit, or
// systemd-socket-activate) passed to this process. Its file-status flags are
// left exactly as systemd set them (blocking unless NonBlocking=yes).
type Activated struct {
	// Name is its LISTEN_FDNAMES entry (FileDescriptorName=), "unknown" when
	// systemd named none.
	Name string
	// Network is "tcp" or "unix".
	Network string
	// Addr is what the socket is bound to: an address and port for tcp, a path
	// for unix.
	Addr string
	// From says where the socket came from, for the log: "" is systemd's
	// socket activation; the agent names other origins (a worker a dead
	// agent left).
	From string

	ap   netip.AddrPort // tcp
	file *os.File
}

// String describes the socket for logs.
func (s *Activated) String() string {
	return fmt.Sprintf("%s %s (fd name %q)", s.Network, s.Addr, s.Name)
}

// Close closes this process's copy (systemd keeps its own). Safe to call twice.
func (s *Activated) Close() error {
	if s.file == nil {
		return nil
	}
	err := s.file.Close()
	s.file = nil
	return err
}

// ActivationFromEnv returns the listening sockets passed to this process by
// socket activation: LISTEN_FDS descriptors from fd 3 when LISTEN_PID is this
// process's pid. It removes LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES from the
// environment in every case, so that no child (or a new agent after a handoff)
// takes them for its own. Descriptors that are not listening stream sockets
// are closed and reported in skipped. Every returned descriptor is made
// close-on-exec (a descriptor flag, not a file-status flag: O_NONBLOCK and
// the rest stay as they are).
func ActivationFromEnv() (socks []*Activated, skipped []string, err error) {
	pidStr, fdsStr, namesStr := os.Getenv(EnvListenPID), os.Getenv(EnvListenFDs), os.Getenv(EnvListenFDNames)
	for _, k := range []string{EnvListenPID, EnvListenFDs, EnvListenFDNames} {
		_ = os.Unsetenv(k)
	}
	if fdsStr == "" {
		return nil, nil, nil
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid != os.Getpid() {
		// Meant for another process (e.g. our parent): not ours to touch.
		return nil, nil, nil
	}
	n, err := strconv.Atoi(fdsStr)
	if err != nil || n < 0 {
		return nil, nil, fmt.Errorf("socket activation: LISTEN_FDS=%q is not a count of descriptors", fdsStr)
	}
	var names []string
	if namesStr != "" {
		names = strings.Split(namesStr, ":")
	}
	for i := range n {
		fd := listenFDsStart + i
		name := "unknown"
		if len(names) == n && names[i] != "" {
			name = names[i]
		}
		s, err := inspect(fd, name)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("fd %d (%q): %v", fd, name, err))
			_ = unix.Close(fd)
			continue
		}
		socks = append(socks, s)
	}
	return socks, skipped, nil
}

// inspect checks that fd is a listening stream socket and reads its address.
// It only reads socket options and sets FD_CLOEXEC.
func inspect(fd int, name string) (*Activated, error) {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, fmt.Errorf("not an open descriptor: %w", err)
	}
	unix.CloseOnExec(fd)
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return nil, fmt.Errorf("not a socket: %w", err)
	}
	if typ != unix.SOCK_STREAM {
		return nil, errors.New("not a stream socket (use ListenStream=)")
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc == 0 {
		return nil, errors.New("not a listening socket (Accept=yes is not supported)")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, fmt.Errorf("getsockname: %w", err)
	}
	s := &Activated{Name: name}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		s.Network, s.ap = "tcp", netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		s.Network, s.ap = "tcp", netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	case *unix.SockaddrUnix:
		s.Network, s.Addr = "unix", a.Name
	default:
		return nil, fmt.Errorf("unsupported address family %T", sa)
	}
	if s.Network == "tcp" {
		s.Addr = s.ap.String()
	}
	s.file = os.NewFile(uintptr(fd), "systemd:"+name) // NewFile keeps the flags
	return s, nil
}

// Matches reports whether the socket is bound to network/address as the
// config writes them (host:port, or an absolute path). A wildcard host
// ("", 0.0.0.0 or ::) matches a socket bound to either wildcard; a host name
// is resolved.
func (s *Activated) Matches(network, address string) bool {
	switch network {
	case "unix":
		return s.Network == "unix" && filepath.Clean(s.Addr) == filepath.Clean(address)
	case "tcp", "tcp4", "tcp6":
	default:
		return false
	}
	if s.Network != "tcp" || !s.FamilyFits(network) {
		return false
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || uint16(port) != s.ap.Port() {
		return false
	}
	sock := s.ap.Addr().Unmap()
	if host == "" {
		return sock.IsUnspecified()
	}
	want, err := netip.ParseAddr(host)
	if err != nil {
		ta, rerr := net.ResolveTCPAddr(network, address)
		if rerr != nil {
			return false
		}
		want = ta.AddrPort().Addr()
	}
	want = want.Unmap()
	if want.IsUnspecified() {
		return sock.IsUnspecified()
	}
	return want == sock
}

// FamilyFits reports whether the socket can stand for a listener of network
// (tcp, tcp4, tcp6 or unix) whatever its address.
func (s *Activated) FamilyFits(network string) bool {
	switch network {
	case "unix":
		return s.Network == "unix"
	case "tcp":
		return s.Network == "tcp"
	case "tcp4":
		return s.Network == "tcp" && s.ap.Addr().Unmap().Is4()
	case "tcp6":
		return s.Network == "tcp" && s.ap.Addr().Is6() && !s.ap.Addr().Is4In6()
	}
	return false
}

// AdoptActivated turns s into the Listener for network/address (as
// configured) and registers it in store under that address's Key, so that it
// crosses the next agent handoff like a socket the agent opened. s must not
// be used afterwards.
func AdoptActivated(store Store, s *Activated, network, address string) (*Listener, error) {
	if s.file == nil {
		return nil, fmt.Errorf("adopt %s: already adopted or closed", s)
	}
	l := Adopt(s.file, network, address)
	s.file = nil
	if store != nil {
		if err := store.AddFile(Key(network, address), l.file); err != nil {
			l.Close()
			return nil, fmt.Errorf("keep %s %s for handoff: %w", network, address, err)
		}
	}
	return l, nil
}
