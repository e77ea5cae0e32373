package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/handoff/bindtrap"
	"github.com/deployd/deployd/internal/addrpolicy"
)

// An app with no listen list (a Node.js app, config.App.DiscoversListen)
// learns its address from its own bind in its real workers: the bind
// trap sends the bind to the agent, the address policy (addrpolicy)
// accepts or refuses it, and an accepted address gets a listening socket
// the agent keeps for the app, leased by the spec whose worker bound it
// (handoff.Lease.Learn), so that later workers and releases get the same
// socket and an agent upgrade or restart takes it over with the workers.
// state.json keeps the addresses (AppState.Learned) for that.

// learner decides the addresses apps without a listen list learn from
// their workers' binds, and keeps state.json naming them. It owns the
// lock that orders those decisions; it reaches state.json through state,
// the running apps through apps, and never the agent.
type learner struct {
	log   hclog.Logger
	state *stateFile
	// settings are the agent's own addresses (metrics, control socket),
	// which no app may take.
	settings config.Agent
	// apps returns the configs of the apps the agent runs.
	apps func() []*config.App
	// deciding makes the decisions of every app one at a time (two
	// workers asking for one port get one socket). Like an operation
	// lock it is held across a decision on purpose, over leaf calls only
	// (the state file, the registry, sock_diag), none of which comes back
	// here.
	deciding sync.Mutex
}

// policy is the bind policy (workers.Spec.BindPolicy) of a spec of
// app whose listeners lease holds.
func (l *learner) policy(app *config.App, lease *handoff.Lease) func([]bindtrap.Listen) bindtrap.Decide {
	return func([]bindtrap.Listen) bindtrap.Decide {
		return func(r bindtrap.Request) bindtrap.Decision { return l.bind(app, lease, r) }
	}
}

// bind answers one bind of a worker of app: a TCP bind of a port
// with the socket of that address (the one the spec learned already, or
// a new one the policy accepts), or a refusal the app sees as EACCES or
// EADDRINUSE; other binds (UDP, port 0) run as asked. Called from a
// trap's goroutine; l.deciding makes the decisions of every app one at a
// time (two workers asking for one port get one socket), and is held
// only over leaf calls (the state file, the registry, sock_diag).
func (l *learner) bind(app *config.App, lease *handoff.Lease, r bindtrap.Request) bindtrap.Decision {
	if !r.Stream || r.Addr.Port() == 0 {
		return bindtrap.Decision{}
	}
	l.deciding.Lock()
	defer l.deciding.Unlock()
	if have, ok := bindtrap.Find(learnedListens(lease.Learned()), r); ok {
		return bindtrap.Decision{Sock: have.Sock, Name: have.Name}
	}
	raw := askedURL(r.Addr)
	addr, err := l.accepted(withApp(l.apps(), app), app.Name, raw)
	if err != nil {
		return bindtrap.Decision{Errno: refusalErrno(err), Refused: err.Error()}
	}
	b, err := lease.Learn(app.Name, handoff.Want{URL: addr.String(), Network: addr.Network, Address: addr.Address,
		Name: addr.String(), Nonblocking: app.Nonblocking, NoDelay: app.TCPNoDelay})
	if err != nil {
		l.log.Error("could not bind the address an app's code asked for", "app", app.Name, "asked", raw, "error", err)
		return bindtrap.Decision{Errno: syscall.EADDRINUSE,
			Refused: fmt.Sprintf("app %s asked to listen on %s, which deployd could not bind: %v", app.Name, raw, err)}
	}
	if err := l.record(app.Name, addr.String()); err != nil {
		l.log.Error("learned listen not recorded: an agent restart would not take it over", "app", app.Name, "error", err)
	}
	l.log.Info("listen learned from the app's own bind", "app", app.Name, "listen", addr.String(), "pid", r.PID)
	return bindtrap.Decision{Sock: b.Listener, Name: b.Name}
}

// askedURL is the listen URL of a bind's address: every address of
// either family as 0.0.0.0 (as a listen(port) is served), a host as it is.
func askedURL(ap netip.AddrPort) string {
	host := ap.Addr()
	if host.IsUnspecified() {
		host = netip.IPv4Unspecified()
	}
	return "tcp://" + netip.AddrPortFrom(host, ap.Port()).String()
}

// learnedListens are the learned listeners ls as the trap matches them.
func learnedListens(ls []handoff.Bound) []bindtrap.Listen {
	out := make([]bindtrap.Listen, 0, len(ls))
	for _, b := range ls {
		if ap, err := netip.ParseAddrPort(b.Address); err == nil {
			out = append(out, bindtrap.Listen{Addr: ap, Sock: b.Listener, Name: b.Name})
		}
	}
	return out
}

// refusalErrno is what the app's bind returns for a refusal: the address
// is another's (EADDRINUSE), or not the app's to take (EACCES).
func refusalErrno(err error) syscall.Errno {
	var refused *addrpolicy.RefusedError
	if errors.As(err, &refused) && (refused.Reason == addrpolicy.OtherOwner || refused.Reason == addrpolicy.HeldBy) {
		return syscall.EADDRINUSE
	}
	return syscall.EACCES
}

// restore leases again, in lease, the addresses app learned before
// (state.json): an agent starting, after an upgrade or a crash, whose
// workers serve them, takes over the same sockets (the previous agent's,
// or a survivor's). Each is checked against the config (apps) again; one
// that is refused now, or cannot be had, is dropped and logged.
func (l *learner) restore(apps []*config.App, app *config.App, lease *handoff.Lease) {
	if !app.DiscoversListen() {
		return
	}
	l.deciding.Lock()
	defer l.deciding.Unlock()
	for _, raw := range learnedOf(l.state.get(app.Name)) {
		addr, err := l.accepted(apps, app.Name, raw)
		if err == nil {
			_, err = lease.Learn(app.Name, handoff.Want{URL: addr.String(), Network: addr.Network, Address: addr.Address,
				Name: addr.String(), Nonblocking: app.Nonblocking, NoDelay: app.TCPNoDelay})
		}
		if err != nil {
			l.log.Error("learned listen dropped", "app", app.Name, "listen", raw, "error", err)
		}
	}
	l.syncLocked(app.Name, lease)
}

// sync makes state.json name the addresses lease learned: the
// running spec's, once an operation settled (a reload's new addresses
// that did not go through are forgotten, like those its workers no
// longer ask for).
func (l *learner) sync(app string, lease *handoff.Lease) {
	l.deciding.Lock()
	defer l.deciding.Unlock()
	l.syncLocked(app, lease)
}

func (l *learner) syncLocked(app string, lease *handoff.Lease) {
	var addrs []string
	for _, b := range lease.Learned() {
		addrs = append(addrs, b.Name)
	}
	if slices.Equal(addrs, learnedOf(l.state.get(app))) {
		return
	}
	if err := l.state.update(app, func(st *AppState) { setLearned(st, addrs) }); err != nil {
		l.log.Error("learned listens not recorded", "app", app, "error", err)
	}
}

// record adds addr to app's learned addresses in state.json.
func (l *learner) record(app, addr string) error {
	have := learnedOf(l.state.get(app))
	if slices.Contains(have, addr) {
		return nil
	}
	return l.state.update(app, func(st *AppState) { setLearned(st, append(slices.Clone(have), addr)) })
}

// accepted puts the address app name's code asked for (raw, a listen
// URL) to the address policy, with every address of apps that is not
// name's and those name serves now; a refusal is logged and returned.
func (l *learner) accepted(apps []*config.App, name, raw string) (addrpolicy.Addr, error) {
	network, address, _ := strings.Cut(raw, "://")
	req := addrpolicy.Request{
		App:    name,
		Asked:  addrpolicy.Addr{Network: network, Address: address},
		Others: l.otherAddrs(apps, name),
	}
	for _, app := range apps {
		if app.Name == name {
			req.Ports = app.AllowPorts
		}
	}
	for _, had := range learnedOf(l.state.get(name)) {
		if held, err := addrpolicy.Parse(had); err == nil {
			req.Held = append(req.Held, held)
		}
	}
	addr, err := addrpolicy.Decide(req)
	var refused *addrpolicy.RefusedError
	if errors.As(err, &refused) {
		l.log.Error("refused the address an app's code asked for", "app", name, "asked", raw,
			"reason", string(refused.Reason), "by", refused.By, "fix", refused.Fix)
	}
	return addr, err
}

// otherAddrs are the addresses of apps that are not app name's: other
// apps' listen lists, the addresses other apps without one learned
// (state.json), the agent's control socket and metrics.
func (l *learner) otherAddrs(apps []*config.App, name string) []addrpolicy.Use {
	var out []addrpolicy.Use
	for _, app := range apps {
		if app.Name == name {
			continue
		}
		owner := "app " + app.Name
		for _, ln := range app.Listen {
			out = append(out, addrpolicy.Use{Owner: owner, Addr: ln.Addr()})
		}
		for _, raw := range learnedOf(l.state.get(app.Name)) {
			if ln, err := addrpolicy.Parse(raw); err == nil {
				out = append(out, addrpolicy.Use{Owner: owner + " (learned from its code)", Addr: ln})
			}
		}
	}
	if l.settings.Metrics != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] metrics", Addr: addrpolicy.Addr{Network: "tcp", Address: l.settings.Metrics}})
	}
	if l.settings.Socket != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] socket", Addr: addrpolicy.Addr{Network: "unix", Address: l.settings.Socket}})
	}
	return out
}

// configApps are the apps of cfg, in name order.
func configApps(cfg *config.Config) []*config.App {
	out := make([]*config.App, 0, len(cfg.AppNames))
	for _, n := range cfg.AppNames {
		out = append(out, cfg.Apps[n])
	}
	return out
}

// withApp is apps with app in place of the one of its name: the config
// of the spec whose worker asks (a reload's, before it runs) decides its
// own allow_ports, beside the other apps' running configs.
func withApp(apps []*config.App, app *config.App) []*config.App {
	out := []*config.App{app}
	for _, c := range apps {
		if c.Name != app.Name {
			out = append(out, c)
		}
	}
	return out
}

// appConfigs are the configs of rts.
func appConfigs(rts []*appRT) []*config.App {
	out := make([]*config.App, 0, len(rts))
	for _, rt := range rts {
		out = append(out, rt.config())
	}
	return out
}
