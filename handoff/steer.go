package handoff

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/internal/steer"
)

// Balance values of a Want (the app's balance setting).
const (
	BalanceShared = "shared"
	BalanceEven   = "even"
	BalanceSticky = "sticky"
	// BalanceAuto is shared until a worker binds the address itself (its
	// bind answered, handoff/bindtrap), then even (steerbind.go).
	BalanceAuto = "auto"
)

// steerKey names the steering program of the listener of key across a
// handoff.
func steerKey(key string) string { return key + "#steer" }

// Steered is a listener's kernel steering: set when each worker gets a
// socket of its own (Member) and a program picks among them.
type Steered struct {
	Group *steer.Group
	// prog is the program's descriptor kept for the next agent.
	prog *os.File
	// nonblocking and noDelay are what each member socket gets.
	nonblocking, noDelay bool
	// onBind marks a BalanceAuto listener (steerbind.go): its steering is
	// in effect once on is set, and until then its socket is shared.
	onBind bool
	on     atomic.Bool
}

// Steered returns the listener's steering, nil for a shared listener (the
// workers share the socket itself), which an auto listener is until a
// worker bound its address.
func (l *Listener) Steered() *Steered {
	if s := l.steered; s != nil && (!s.onBind || s.on.Load()) {
		return s
	}
	return nil
}

// Balance says how the listener spreads connections: "shared" or the
// steering mode.
func (l *Listener) Balance() string {
	st := l.Steered()
	if st == nil {
		return BalanceShared
	}
	m, err := st.Group.Mode()
	if err != nil {
		return BalanceShared
	}
	return m.String()
}

// Member opens a socket of the listener's reuseport group for one worker,
// in the mode and with the TCP_NODELAY setting of the spec that leased it.
// It takes no connection until its worker is put in a slot. An auto
// listener gives one before its steering is in effect too: for the bind
// that turns it on (SteerOnBind).
func (l *Listener) Member() (*Listener, error) {
	if l.steered == nil {
		return nil, errors.New("handoff: Member of a shared listener")
	}
	addr, err := l.LocalAddr()
	if err != nil {
		return nil, err
	}
	f, err := l.steered.Group.Listen(l.Network, addr)
	if err != nil {
		return nil, err
	}
	m := &Listener{Network: l.Network, Address: l.Address, file: f, fd: f.Fd()}
	if err = unix.SetNonblock(int(m.fd), l.steered.nonblocking); err == nil {
		err = m.SetNoDelay(l.steered.noDelay)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("worker socket for %s: %w", l.Address, err)
	}
	return m, nil
}

// File returns the socket's descriptor as a file (the listener's own: the
// caller must not close it), nil once closed: for a worker's own socket
// that crosses an agent handoff.
func (l *Listener) File() *os.File {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.file
}

// wantsSteering reports the mode w asks for; ok is false for a shared
// listener (unix sockets are always shared).
func wantsSteering(w Want) (steer.Mode, bool) {
	if w.Network == "unix" {
		return steer.Even, false
	}
	switch w.Balance {
	case BalanceEven:
		return steer.Even, true
	case BalanceSticky:
		return steer.Sticky, true
	case BalanceAuto:
		return steer.Even, true
	}
	return steer.Even, false
}

// openSteered opens (or takes over from the previous agent) the anchor of
// a steered listener and its program; an auto listener's anchor listens
// until its steering is on (steerbind.go). With a nil listener and an
// error, the caller falls back to a shared socket and says why; a non-nil
// listener with an error is the previous agent's shared socket, kept as
// it is.
func openSteered(store Store, w Want, mode steer.Mode) (*Listener, error) {
	key := Key(w.Network, w.Address)
	auto := w.Balance == BalanceAuto
	var inherited, prog *os.File
	if store != nil {
		var err error
		if inherited, err = store.File(key); err == nil && inherited != nil {
			prog, err = store.File(steerKey(key))
		}
		if err != nil {
			return nil, fmt.Errorf("inherit %s: %w", w.URL, err)
		}
	}
	if inherited != nil {
		l := Adopt(inherited, w.Network, w.Address)
		if prog == nil {
			return l, errors.New("the previous agent passed the address's socket shared by every worker; " +
				"steering starts once the socket is opened anew (remove the app, reload, add it again)")
		}
		g, err := steer.FromFile(prog)
		if err == nil && !auto {
			err = g.SetMode(mode)
		}
		if err != nil {
			if g != nil {
				g.Close()
			}
			// The anchor only holds the address: shared, it must listen.
			if lerr := unix.Listen(int(l.fd), unix.SOMAXCONN); lerr != nil {
				l.Close()
				return nil, errors.Join(err, lerr)
			}
			return l, err
		}
		l.steered = &Steered{Group: g, nonblocking: w.Nonblocking, noDelay: w.NoDelay, onBind: auto}
		// An auto listener's socket stopped listening when a bind turned
		// its steering on: the kernel's fact, across any number of agents.
		l.steered.on.Store(auto && !acceptsConnections(l.fd))
		return l, nil
	}
	g, err := steer.New(mode)
	if err != nil {
		return nil, err
	}
	f, err := steer.Anchor(w.Network, w.Address)
	if err != nil {
		g.Close()
		var errno unix.Errno
		if errors.As(err, &errno) && errno == unix.EADDRINUSE {
			return nil, &AddrInUseError{URL: w.URL, Holder: Holder(w.Network, w.Address), Err: err}
		}
		return nil, err
	}
	l := &Listener{Network: w.Network, Address: w.Address, file: f, fd: f.Fd(),
		steered: &Steered{Group: g, nonblocking: w.Nonblocking, noDelay: w.NoDelay, onBind: auto}}
	if auto {
		if err := l.listenShared(w.Nonblocking); err != nil {
			l.Close()
			return nil, err
		}
	}
	if store != nil {
		pf, err := g.File()
		if err == nil {
			l.steered.prog = pf
			err = errors.Join(store.AddFile(key, f), store.AddFile(steerKey(key), pf))
		}
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("keep %s for handoff: %w", w.URL, err)
		}
	}
	return l, nil
}
