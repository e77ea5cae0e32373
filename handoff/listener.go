package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is a listening socket kept by the agent for its workers. The agent
// never accepts on it; it only passes it on. Its exported fields never change
// after creation (the name a worker sees belongs to the spec that passes it:
// see Bound); mu guards the descriptor, which Close clears. Safe for
// concurrent use.
type Listener struct {
	Network string // tcp, tcp4, tcp6 or unix
	Address string // as configured
	// Inherited is true when the socket came from a previous agent or systemd.
	Inherited bool

	mu   sync.Mutex
	file *os.File // nil once closed
	fd   uintptr
	// steered is set for a listener whose workers each get a socket of
	// their own (steer.go); the descriptor is then the group's anchor.
	steered *Steered
}

// Bound is a listener as one spec passes it to its workers: under Name in
// LISTEN_FDNAMES.
type Bound struct {
	*Listener
	Name string
}

// ErrClosed is returned by Fd after Close.
var ErrClosed = errors.New("handoff: listener closed")

// Fd returns the descriptor number without touching its flags, or an error
// wrapping ErrClosed once the listener is closed (the kernel may have given
// the number to another file since).
func (l *Listener) Fd() (uintptr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil {
		return 0, fmt.Errorf("%s %s: %w", l.Network, l.Address, ErrClosed)
	}
	return l.fd, nil
}

// Key is the name under which the listener crosses an agent handoff.
func (l *Listener) Key() string { return Key(l.Network, l.Address) }

// Key is the handoff name of a listener for network and address.
func Key(network, address string) string {
	return "deployd-listener:" + network + ":" + address
}

// Nonblocking reports whether O_NONBLOCK is set on the shared file description.
func (l *Listener) Nonblocking() (bool, error) {
	fd, err := l.Fd()
	if err != nil {
		return false, err
	}
	flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		return false, fmt.Errorf("fcntl %s: %w", l.Address, err)
	}
	return flags&unix.O_NONBLOCK != 0, nil
}

// Shutdown stops the socket listening for every process that holds it
// (shutdown(2) acts on the socket, not on one descriptor): for a listener no
// worker uses any more, whose copies (e.g. tableflip's) would keep it bound.
func (l *Listener) Shutdown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_ = unix.Shutdown(int(l.fd), unix.SHUT_RDWR)
	}
}

// Close closes the agent's copy and clears the descriptor number. Workers
// keep theirs. Safe to call twice.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil {
		return nil
	}
	err := l.file.Close()
	l.file, l.fd = nil, 0
	if l.steered != nil {
		err = errors.Join(err, l.steered.Group.Close())
		if l.steered.prog != nil {
			err = errors.Join(err, l.steered.prog.Close())
		}
	}
	return err
}

// Store keeps descriptors across an agent handoff. *tableflip.Fds implements it.
type Store interface {
	File(name string) (*os.File, error)
	AddFile(name string, f *os.File) error
}

// ErrAddressInUse matches (errors.Is) the *AddrInUseError returned when
// another process holds the address.
var ErrAddressInUse = errors.New("handoff: address already in use")

// Acquire returns the listener for network/address: the one a previous agent
// or systemd passed on through store when there is one, else a new socket with
// O_NONBLOCK set as asked. An inherited socket keeps its flags. The listener is
// registered in store so that it crosses the next handoff.
func Acquire(store Store, network, address string, nonblocking bool) (*Listener, error) {
	return acquire(store, Want{Network: network, Address: address, Nonblocking: nonblocking})
}

// acquire is Acquire for w: a unix socket it creates has its folders
// checked with w.CheckFolder (openSocketDir).
func acquire(store Store, w Want) (*Listener, error) {
	network, address, nonblocking := w.Network, w.Address, w.Nonblocking
	key := Key(network, address)
	var l *Listener
	if store != nil {
		f, err := store.File(key)
		if err != nil {
			return nil, fmt.Errorf("inherit %s %s: %w", network, address, err)
		}
		if f != nil {
			l = Adopt(f, network, address)
		}
	}
	if l == nil {
		var err error
		if l, err = open(network, address, nonblocking, w.CheckFolder); err != nil {
			return nil, err
		}
	}
	// An inherited file is registered in store already (tableflip keeps
	// what File returned for the next handoff).
	if store != nil && !l.Inherited {
		if err := store.AddFile(key, l.file); err != nil {
			l.Close()
			return nil, fmt.Errorf("keep %s %s for handoff: %w", network, address, err)
		}
	}
	return l, nil
}

// Adopt wraps an inherited descriptor (e.g. from systemd socket activation).
func Adopt(f *os.File, network, address string) *Listener {
	l := &Listener{Network: network, Address: address, Inherited: true, file: f}
	if raw, err := f.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { l.fd = fd })
	}
	return l
}

// Open creates a listening socket. A busy address returns an error wrapping
// ErrAddressInUse; a stale unix socket file (nobody accepting) is replaced.
// A unix socket's folders are checked as openSocketDir does, trusting root and
// the agent's own user and no group.
func Open(network, address string, nonblocking bool) (*Listener, error) {
	return open(network, address, nonblocking, nil)
}

// open is Open with checkFolder for a unix socket's folders (Want).
func open(network, address string, nonblocking bool, checkFolder func(dir string) error) (*Listener, error) {
	var dir *socketDir
	if network == "unix" {
		var err error
		if dir, err = openSocketDir(address, checkFolder); err != nil {
			return nil, err
		}
		defer dir.close()
		if err := removeStaleUnix(address); err != nil {
			return nil, err
		}
	}
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), network, address)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, &AddrInUseError{URL: network + "://" + address, Holder: Holder(network, address), Err: err}
		}
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			return nil, fmt.Errorf("listen %s %s: permission denied; ports below 1024 need root or CAP_NET_BIND_SERVICE: %w", network, address, err)
		}
		return nil, fmt.Errorf("listen %s %s: %w", network, address, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false) // the socket file outlives this copy
		if err := dir.holdsSocket(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	// Duplicate the descriptor, set the mode the workers get, and drop Go's
	// copy: from here on nothing in the agent polls or accepts on it.
	var dup int
	var derr error
	raw, err := ln.(syscall.Conn).SyscallConn()
	if err == nil {
		err = raw.Control(func(fd uintptr) {
			dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3)
		})
	}
	ln.Close()
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("dup listener %s: %w", address, err)
	}
	if err := unix.SetNonblock(dup, nonblocking); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("set O_NONBLOCK on %s: %w", address, err)
	}
	f := os.NewFile(uintptr(dup), Key(network, address))
	return &Listener{Network: network, Address: address, file: f, fd: uintptr(dup)}, nil
}

// removeStaleUnix removes a unix socket file nobody accepts on.
func removeStaleUnix(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen unix %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("listen unix %s: a file that is not a socket is in the way; remove it or choose another path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return &AddrInUseError{URL: "unix://" + path, Holder: Holder("unix", path)}
	}
	if err := RemoveSocketFile(path); err != nil {
		return fmt.Errorf("listen unix %s: a stale socket is in the way: %w", path, err)
	}
	return nil
}

// SetNoDelay sets or clears TCP_NODELAY on a TCP listening socket; Linux
// copies it to every connection accepted afterwards, so servers that never
// set it themselves (uvicorn on an inherited fd) do not wait on Nagle's
// algorithm. A unix listener is left alone.
func (l *Listener) SetNoDelay(on bool) error {
	if l.Network == "unix" {
		return nil
	}
	fd, err := l.Fd()
	if err != nil {
		return err
	}
	v := 0
	if on {
		v = 1
	}
	if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, v); err != nil {
		return fmt.Errorf("set TCP_NODELAY on %s %s: %w", l.Network, l.Address, err)
	}
	return nil
}

// AcceptQueue returns how many connections wait in a TCP listener's accept
// queue and its backlog (TCP_INFO of a listening socket: tcpi_unacked and
// tcpi_sacked). ok is false for a unix listener or a closed one.
func (l *Listener) AcceptQueue() (queued, backlog int, ok bool) {
	if l.Network == "unix" {
		return 0, 0, false
	}
	fd, err := l.Fd()
	if err != nil {
		return 0, 0, false
	}
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, false
	}
	return int(info.Unacked), int(info.Sacked), true
}

// Inode returns the socket's inode, by which /proc/PID/fd and the
// kernel's socket dumps (inet_diag) name it in every process that holds it.
func (l *Listener) Inode() (uint64, error) {
	fd, err := l.Fd()
	if err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		return 0, fmt.Errorf("fstat %s %s: %w", l.Network, l.Address, err)
	}
	return st.Ino, nil
}

// LocalAddr returns the bound address (a configured port 0 shows the real one).
func (l *Listener) LocalAddr() (string, error) {
	fd, err := l.Fd()
	if err != nil {
		return "", err
	}
	sa, err := unix.Getsockname(int(fd))
	if err != nil {
		return "", fmt.Errorf("getsockname: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), fmt.Sprint(a.Port)), nil
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), fmt.Sprint(a.Port)), nil
	case *unix.SockaddrUnix:
		return a.Name, nil
	}
	return "", fmt.Errorf("getsockname: unexpected address %T", sa)
}
