package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/addrpolicy"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

// builder turns an app's config into what runs it: an appRT with its
// listeners leased, its logs open and its supervisor built (app), each
// workers.Spec (spec: the one place a config becomes what a supervisor
// runs, numbered by generation) and, for an app without a listen list, the
// address its code asks for (discoverListens). It owns the generation
// count and the generations inherited at start; it reaches the state file,
// the registry, the releases and the record book through the pointers it
// was built with, and never the agent.
type builder struct {
	log      hclog.Logger
	shim     string
	stateDir string
	logDir   string
	reg      *handoff.Registry
	releases *release.Store
	state    *stateFile
	book     *recordBook

	generation generations // each app's last spec generation
	mu         sync.Mutex  // guards inherited; taken in leaves only
	// inherited is the newest generation of each app's workers that the
	// previous agent handed over or a dead agent left, until the start has
	// adopted them (inherit).
	inherited map[string]int
}

// inherit sets the generations r hands over (nil: none any more).
func (b *builder) inherit(r *received) {
	gens := map[string]int{}
	if r != nil {
		for app, hs := range r.byApp {
			for _, h := range hs {
				gens[app] = max(gens[app], h.Generation)
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inherited = gens
}

// inheritedGeneration is the newest generation of app's workers that the
// previous agent handed over or a dead agent left (0 without any).
func (b *builder) inheritedGeneration(app string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inherited[app]
}

// app leases the app's listeners, opens its logs and builds its
// supervisor. Nothing runs yet.
func (b *builder) app(app *config.App) (*appRT, error) {
	lease, err := b.reg.Acquire(app.Name, wants(app))
	if err != nil {
		return nil, err
	}
	rt := &appRT{name: app.Name, log: b.log.With("app", app.Name), cfg: app, lease: lease}
	for _, s := range []struct {
		dst  **logs.Sink
		name string
	}{{&rt.out, app.Name + ".out.log"}, {&rt.err, app.Name + ".err.log"}} {
		o := logOptions(app)
		// The agent log says when a file cannot be written (a full log_dir)
		// and when it works again, once per episode.
		o.Path, o.Logger = filepath.Join(b.logDir, s.name), rt.log.Named("logs")
		*s.dst, err = logs.OpenSink(o)
		if err != nil {
			rt.closeLogs()
			lease.Release()
			return nil, fmt.Errorf("log file: %w", err)
		}
	}
	spec, err := b.spec(app, lease.Bound(), b.state.get(app.Name).Current)
	if err != nil {
		rt.closeLogs()
		lease.Release()
		return nil, err
	}
	rt.sup = workers.New(workers.Options{
		App: app.Name, Shim: b.shim, Out: rt.out, Err: rt.err, Logger: b.log.Named("workers"),
		BeforeStart: b.book.beforeStart(app.Name), Marker: b.book.marker, OnReady: b.book.markReady,
		Changed:   b.book.poke,
		NotifyDir: filepath.Join(b.stateDir, "run", "notify"),
	}, spec)
	return rt, nil
}

// spec builds the workers.Spec of app's config, a new generation; for an
// app that takes releases, of release rel ("" = none yet: no workers).
func (b *builder) spec(app *config.App, ls []handoff.Bound, rel string) (*workers.Spec, error) {
	gen := b.generation.next(app.Name, func() int { return b.inheritedGeneration(app.Name) })
	cred, err := credential(app)
	if err != nil {
		return nil, err
	}
	release, argv, dir := configRelease(app), app.Command, app.Cwd
	instances := app.Instances
	if n := b.state.get(app.Name).Instances; n > 0 {
		instances = n
	}
	if app.Releases {
		release, dir = rel, b.releases.Path(app.Name, rel)
		argv = releaseArgv(app.Command, dir)
		if rel == "" {
			instances, dir = 0, app.Cwd
		}
	}
	spec := &workers.Spec{
		Release: release, Generation: gen, Argv: argv, Dir: dir,
		Env: appEnv(app), Credential: cred, Instances: instances,
		Listeners: ls, Ready: readyPolicy(app.Ready), ReadyTimeout: app.ReadyTimeout, MinReady: app.MinReady,
		StopSignal:  app.StopSignal,
		StopTimeout: app.StopTimeout, QuietTimeout: app.QuietTimeout, Restart: restartPolicy(app.Restart), MaxSurge: app.MaxSurge,
		MaxMemory: app.MaxMemory, Watchdog: app.Watchdog, RecycleAfter: app.RecycleAfter, CPUAffinity: app.CPUAffinity,
		Health: healthPolicy(app.Health), BindTrap: app.TrapsBind(),
	}
	if app.RecycleAt != "" {
		sched, err := config.ParseRecycleAt(app.RecycleAt) // checked when the config was read
		if err != nil {
			return nil, fmt.Errorf("app %s: recycle_at %q: %w", app.Name, app.RecycleAt, err)
		}
		spec.RecycleAt, spec.RecycleAtText = sched, app.RecycleAt
	}
	if spec.Balance() != handoff.BalanceShared && instances > 0 { // spares need steering (the registry logged a fallback)
		spec.Instances, spec.Spares = instances+app.Spares, app.Spares
	}
	if spec.Node, err = nodeSpec(b.stateDir, app, argv, ls); err != nil {
		return nil, err
	}
	if spec.JS, err = jsSpec(b.stateDir, app, argv, spec.Node != nil); err != nil {
		return nil, err
	}
	return spec, nil
}

// discoverListens fills in the listener of every app of names that has no
// listen list and runs node: the address its first listen(port) asks for,
// which the agent then binds and passes to every worker like a configured
// one, when the address policy allows it (accepted). fresh: run the app
// to find out (a reload: the code may have changed); otherwise the address
// the last run found, kept in state.json, is used when there is one (an
// agent starting, taking over from an upgrade or a crash, whose workers
// already serve it), checked again against the config. It changes cfg
// and state.json only for an accepted address: a refusal changes nothing.
func (b *builder) discoverListens(cfg *config.Config, names []string, fresh bool) error {
	for _, name := range names {
		app := cfg.Apps[name]
		if app == nil || !app.DiscoversListen() {
			continue
		}
		raw := b.state.get(name).Listen
		if fresh || raw == "" {
			var err error
			if raw, err = b.discover(app); err != nil {
				return fmt.Errorf("app %s: %w", name, err)
			}
		}
		addr, err := b.accepted(cfg, name, raw)
		if err != nil {
			return err
		}
		l, err := config.DiscoveredListen(addr.String(), name)
		if err != nil {
			return fmt.Errorf("app %s listens on %s, which deployd cannot serve: %w; add a listen list to [apps.%s]", name, raw, err, name)
		}
		app.Listen = []config.Listen{l}
		if err := b.state.update(name, func(st *AppState) { st.Listen = addr.String() }); err != nil {
			return err
		}
		b.log.Info("listen discovered from the app's own listen call", "app", name, "listen", addr.String())
	}
	return nil
}

// accepted puts the address app name's code asked for (raw, as its
// report said it) to the address policy, with every other address of cfg
// and the one the app serves now; a refusal is logged and returned.
func (b *builder) accepted(cfg *config.Config, name, raw string) (addrpolicy.Addr, error) {
	network, address, _ := strings.Cut(raw, "://")
	req := addrpolicy.Request{
		App:    name,
		Asked:  addrpolicy.Addr{Network: network, Address: address},
		Others: b.otherAddrs(cfg, name),
		Ports:  cfg.Apps[name].AllowPorts,
	}
	if held, err := addrpolicy.Parse(b.state.get(name).Listen); err == nil {
		req.Held = []addrpolicy.Addr{held}
	}
	addr, err := addrpolicy.Decide(req)
	var refused *addrpolicy.RefusedError
	if errors.As(err, &refused) {
		b.log.Error("refused the address an app's code asked for", "app", name, "asked", raw,
			"reason", string(refused.Reason), "by", refused.By)
	}
	return addr, err
}

// otherAddrs are the addresses of cfg that are not app name's: other
// apps' listen lists, the addresses other apps without one serve now
// (state.json), the agent's control socket and metrics.
func (b *builder) otherAddrs(cfg *config.Config, name string) []addrpolicy.Use {
	var out []addrpolicy.Use
	for _, n := range cfg.AppNames {
		if n == name {
			continue
		}
		owner := "app " + n
		for _, l := range cfg.Apps[n].Listen {
			out = append(out, addrpolicy.Use{Owner: owner, Addr: l.Addr()})
		}
		if len(cfg.Apps[n].Listen) == 0 {
			if l, err := addrpolicy.Parse(b.state.get(n).Listen); err == nil {
				out = append(out, addrpolicy.Use{Owner: owner + " (learned from its code)", Addr: l})
			}
		}
	}
	if cfg.Agent.Metrics != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] metrics", Addr: addrpolicy.Addr{Network: "tcp", Address: cfg.Agent.Metrics}})
	}
	if cfg.Agent.Socket != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] socket", Addr: addrpolicy.Addr{Network: "unix", Address: cfg.Agent.Socket}})
	}
	return out
}

// discover runs app once without listeners (workers.Discover) and returns
// the address it asked for.
func (b *builder) discover(app *config.App) (string, error) {
	spec, err := b.spec(app, nil, "")
	if err != nil {
		return "", err
	}
	sup := workers.New(workers.Options{
		App: app.Name, Shim: b.shim, Logger: b.log.Named("workers"), Marker: b.book.marker,
		NotifyDir: filepath.Join(b.stateDir, "run", "notify"),
	}, spec)
	defer sup.Stop()
	return sup.Discover(spec)
}
