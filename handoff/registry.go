package handoff

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// Want is one listener a spec asks for, as the config writes it.
type Want struct {
	URL     string // for messages, e.g. tcp://127.0.0.1:8080#web
	Network string // tcp, tcp4, tcp6 or unix
	Address string
	Name    string // LISTEN_FDNAMES entry, also matched against systemd's FileDescriptorName=
	// Nonblocking is the O_NONBLOCK mode of a socket the registry opens (an
	// inherited one keeps its own).
	Nonblocking bool
	// NoDelay is the TCP_NODELAY setting of a TCP listener, applied to
	// every one the spec leases (inherited ones too): accepted connections
	// inherit it.
	NoDelay bool
	// Balance is BalanceShared ("" too), BalanceEven, BalanceSticky or
	// BalanceAuto: with even and sticky each worker gets a socket of its
	// own and the kernel steers (steer.go), with auto once a worker bound
	// the address itself (steerbind.go); where it cannot, the listener is
	// shared and the registry's log says why.
	Balance string
	// CheckFolder checks the folders above a unix socket path before the
	// registry binds a socket there (config.Config.CheckSocketFolder: only
	// root or the agent's user may be able to change them); nil checks
	// them trusting root and the agent's own user and no group.
	CheckFolder func(dir string) error
}

// Registry owns every listening socket of the agent (the model is
// tableflip's fds.go): it opens them, adopts those systemd or a previous
// agent passed on, registers them in the handoff Store, and closes one when
// the last Lease that uses it is released. One mutex guards everything;
// safe for concurrent use.
type Registry struct {
	store Store // tableflip's Fds; nil in tests
	log   hclog.Logger

	mu        sync.Mutex
	byKey     map[string]*entry
	activated []*Activated // sockets from systemd no Want took yet
}

type entry struct {
	l      *Listener
	leases int
}

// NewRegistry returns a registry that keeps its sockets in store for the
// next handoff and can adopt the given sockets from systemd socket
// activation. log may be nil.
func NewRegistry(store Store, activated []*Activated, log hclog.Logger) *Registry {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Registry{store: store, log: log, byKey: map[string]*entry{}, activated: activated}
}

// Lease is one spec's hold on its listeners. Release it when no worker of
// that spec can run any more; a listener closes when its last lease goes.
type Lease struct {
	r     *Registry
	bound []Bound
	once  sync.Once
	// learned are the listeners Learn added, guarded by r.mu; released
	// is set by Release (under r.mu too): a later Learn is refused.
	learned  []Bound
	released bool
}

// Bound returns the listeners with the names this lease's spec gives them,
// in the order asked.
func (l *Lease) Bound() []Bound { return slices.Clone(l.bound) }

// Release gives the listeners back. Safe to call twice, and on nil.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		l.r.mu.Lock()
		defer l.r.mu.Unlock()
		for _, b := range append(l.bound, l.learned...) {
			l.r.releaseLocked(b.Key())
		}
		l.learned, l.released = nil, true
	})
}

// ErrLeaseReleased is what Learn returns on a released lease.
var ErrLeaseReleased = errors.New("handoff: the lease was released")

// Learn adds the listener of w to the lease, beside the ones it was
// acquired with (not in Bound: a spec's workers do not inherit it), as
// Acquire gets one: the registry's open socket for the address (another
// spec's, which then stays open while this lease holds it too), else a
// previous agent's, else a new one. It is the socket of an address an
// app's own bind asked for, which the agent answers that bind with. A
// listener the lease has already is returned as it is. Safe for
// concurrent use.
func (l *Lease) Learn(app string, w Want) (Bound, error) {
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	if l.released {
		return Bound{}, ErrLeaseReleased
	}
	key := Key(w.Network, w.Address)
	for _, b := range l.learned {
		if b.Key() == key {
			return b, nil
		}
	}
	ln, err := l.r.getLocked(app, w)
	if err != nil {
		var inUse *AddrInUseError
		if errors.As(err, &inUse) {
			inUse.URL = w.URL
			return Bound{}, err
		}
		return Bound{}, fmt.Errorf("listen %s: %w", w.URL, err)
	}
	b := Bound{Listener: ln, Name: w.Name}
	l.learned = append(l.learned, b)
	return b, nil
}

// Learned returns the listeners Learn added, in the order learned.
func (l *Lease) Learned() []Bound {
	if l == nil {
		return nil
	}
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	return slices.Clone(l.learned)
}

// Acquire leases the listeners of wants: the registry's open one for an
// address, else systemd's socket for it, else the previous agent's, else a
// new socket. When one cannot be had, nothing stays leased and the error
// names the listen URL.
func (r *Registry) Acquire(app string, wants []Want) (*Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lease := &Lease{r: r}
	for _, w := range wants {
		l, err := r.getLocked(app, w)
		if err != nil {
			for _, b := range lease.bound {
				r.releaseLocked(b.Key())
			}
			var inUse *AddrInUseError
			if errors.As(err, &inUse) {
				inUse.URL = w.URL // the sentence names the address already
				return nil, err
			}
			return nil, fmt.Errorf("listen %s: %w", w.URL, err)
		}
		lease.bound = append(lease.bound, Bound{Listener: l, Name: w.Name})
	}
	return lease, nil
}

func (r *Registry) getLocked(app string, w Want) (*Listener, error) {
	key := Key(w.Network, w.Address)
	if e := r.byKey[key]; e != nil {
		if err := e.l.SetNoDelay(w.NoDelay); err != nil {
			return nil, err
		}
		r.restyleLocked(app, e.l, w)
		e.leases++
		return e.l, nil
	}
	l, err := r.adoptActivatedLocked(app, w)
	if mode, ok := wantsSteering(w); ok && err == nil {
		// The default auto is as good shared: what it lacks is noted only.
		say := r.log.Warn
		if w.Balance == BalanceAuto {
			say = r.log.Info
		}
		if l != nil {
			say("balance falls back to shared: the socket came from "+activatedFrom(l), "app", app, "listen", w.URL)
		} else if l, err = openSteered(r.store, w, mode); err != nil {
			say("balance falls back to shared: kernel steering is unavailable", "app", app, "listen", w.URL,
				"balance", w.Balance, "reason", err.Error())
			var inUse *AddrInUseError
			if errors.As(err, &inUse) {
				return nil, err
			}
			err = nil
		}
	}
	if err == nil && l == nil {
		l, err = acquire(r.store, w)
		if err == nil && l.Inherited {
			r.log.Info("listener inherited", "app", app, "listen", w.URL)
		}
	}
	if err == nil {
		if err = l.SetNoDelay(w.NoDelay); err != nil {
			l.Close()
		}
	}
	if err != nil {
		return nil, err
	}
	r.byKey[key] = &entry{l: l, leases: 1}
	return l, nil
}

// restyleLocked applies w's balance to the open listener l: even and sticky
// switch at once; shared and steered need the socket opened anew, which a
// lease cannot do while others hold it.
func (r *Registry) restyleLocked(app string, l *Listener, w Want) {
	mode, want := wantsSteering(w)
	switch {
	case want && l.steered != nil:
		if err := l.steered.Group.SetMode(mode); err != nil {
			r.log.Warn("balance unchanged", "app", app, "listen", w.URL, "reason", err.Error())
		}
	case want != (l.steered != nil) && w.Network != "unix":
		r.log.Warn("balance "+l.Balance()+" stays until the listener is opened anew (remove the app from the config, reload, add it back)",
			"app", app, "listen", w.URL, "balance", w.Balance)
	}
}

// activatedFrom says where an adopted socket came from, for a log line.
func activatedFrom(l *Listener) string {
	if l.Inherited {
		return "systemd or a worker of the previous agent"
	}
	return "elsewhere"
}

// releaseLocked drops one lease of key; the last one shuts the socket down
// (shutdown(2) acts on the socket itself, so the copy tableflip keeps for a
// handoff stops listening too), closes it and removes a unix socket file.
func (r *Registry) releaseLocked(key string) {
	e := r.byKey[key]
	if e == nil {
		return
	}
	if e.leases--; e.leases > 0 {
		return
	}
	delete(r.byKey, key)
	r.log.Info("closing listener no app uses", "address", e.l.Address)
	e.l.Shutdown()
	e.l.Close()
	if e.l.Network == "unix" {
		r.removeFileLocked(e.l.Address)
	}
}

// removeFileLocked removes a unix listener's socket file, never through a
// link (RemoveSocketFile): its folder may be one an app's user can change.
func (r *Registry) removeFileLocked(path string) {
	if err := RemoveSocketFile(path); err != nil {
		r.log.Warn("socket file left in place", "path", path, "error", err)
	}
}

// adoptActivatedLocked returns the socket systemd passed for w, matched by
// bound address or else by FileDescriptorName (w.Name), registered in the
// store under w's Key; nil when none matches.
func (r *Registry) adoptActivatedLocked(app string, w Want) (*Listener, error) {
	idx, by := -1, "address"
	for i, s := range r.activated {
		if s.Matches(w.Network, w.Address) {
			idx = i
			break
		}
	}
	if idx < 0 {
		by = "name"
		var named []string
		for i, s := range r.activated {
			if s.Name == w.Name && s.FamilyFits(w.Network) {
				idx = i
				named = append(named, s.Addr)
			}
		}
		if len(named) > 1 {
			return nil, fmt.Errorf("systemd passed %d sockets named %q (%s) and none is bound to %s; "+
				"give each socket unit its own FileDescriptorName= or make a ListenStream= match the address",
				len(named), w.Name, strings.Join(named, ", "), w.Address)
		}
	}
	if idx < 0 {
		return nil, nil
	}
	s := r.activated[idx]
	l, err := AdoptActivated(r.store, s, w.Network, w.Address)
	if err != nil {
		return nil, err
	}
	r.activated = slices.Delete(r.activated, idx, idx+1)
	if s.From != "" {
		// A worker's copy of a socket an agent opened for this listen URL:
		// matched by address, in the mode it was opened with.
		r.log.Info("adopted socket from "+s.From, "app", app, "listen", w.URL, "socket", s.Addr)
		return l, nil
	}
	r.log.Info("adopted socket from systemd socket activation", "app", app, "listen", w.URL,
		"socket", s.Addr, "fd_name", s.Name, "matched_by", by)
	if by == "name" {
		r.log.Warn("the socket from systemd is bound to another address than the listen URL; serving on systemd's",
			"app", app, "listen", w.URL, "socket", s.Addr)
	}
	// The workers get the socket as systemd made it (NonBlocking= of the service).
	if nb, err := l.Nonblocking(); err == nil && nb != w.Nonblocking {
		r.log.Warn("the socket from systemd has another O_NONBLOCK mode than the app's nonblocking setting; "+
			"workers get systemd's (set NonBlocking= in the service to match)",
			"app", app, "listen", w.URL, "nonblocking", nb, "app_nonblocking", w.Nonblocking)
	}
	return l, nil
}

// Unclaimed describes the sockets from systemd no Want took so far.
func (r *Registry) Unclaimed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.activated))
	for _, s := range r.activated {
		out = append(out, s.String())
	}
	return out
}

// Close closes the agent's copy of every socket, leased or not, and the
// unclaimed sockets from systemd; it neither shuts them down nor removes a
// socket file (after a handoff the new agent serves them; see
// RemoveSocketFiles). Later Acquires open new sockets. Safe to call twice.
func (r *Registry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, e := range r.byKey {
		errs = append(errs, e.l.Close())
	}
	for _, s := range r.activated {
		errs = append(errs, s.Close())
	}
	r.byKey, r.activated = map[string]*entry{}, nil
	return errors.Join(errs...)
}

// RemoveSocketFiles removes the files of the unix sockets the registry
// opened itself (not those systemd or a previous agent passed on): for a
// real shutdown, before Close.
func (r *Registry) RemoveSocketFiles() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.byKey {
		if e.l.Network == "unix" && !e.l.Inherited {
			r.removeFileLocked(e.l.Address)
		}
	}
}

// leases reports how many leases hold the listener for network/address (0:
// not open).
func (r *Registry) leases(network, address string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.byKey[Key(network, address)]; e != nil {
		return e.leases
	}
	return 0
}
