package agent

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

// builder turns an app's config into what runs it: an appRT with its
// listeners leased, its logs open and its supervisor built (app), each
// workers.Spec (spec: the one place a config becomes what a supervisor
// runs, numbered by generation) with, for an app without a listen list,
// the bind policy by which its workers learn their address (learn). It
// owns the generation count and the generations inherited at start; it
// reaches the state file, the registry, the releases, the record book and
// the learner through the pointers it was built with, and never the agent.
type builder struct {
	log      hclog.Logger
	shim     string
	stateDir string
	logDir   string
	reg      *handoff.Registry
	releases *release.Store
	state    *stateFile
	book     *recordBook
	learn    *learner

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

// app leases the app's listeners (and those it learned before, checked
// against cfg: learn.go), opens its logs and builds its supervisor.
// Nothing runs yet.
func (b *builder) app(cfg *config.Config, app *config.App) (*appRT, error) {
	lease, err := b.reg.Acquire(app.Name, wants(app, cfg.CheckSocketFolder))
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
	b.learn.restore(configApps(cfg), app, lease)
	spec, err := b.spec(app, lease, b.state.get(app.Name).Current)
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

// spec builds the workers.Spec of app's config, a new generation, with
// the listeners of lease; for an app that takes releases, of release rel
// ("" = none yet: no workers). An app with no listen list learns its
// address from its workers' binds into lease (learn.go).
func (b *builder) spec(app *config.App, lease *handoff.Lease, rel string) (*workers.Spec, error) {
	ls := lease.Bound()
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
		MaxMemory: app.MaxMemory, Limits: app.Limits, Watchdog: app.Watchdog, RecycleAfter: app.RecycleAfter, CPUAffinity: app.CPUAffinity,
		Health: healthPolicy(app.Health), BindTrap: app.TrapsBind(),
	}
	if app.DiscoversListen() {
		spec.BindTrap, spec.BindPolicy = true, b.learn.policy(app, lease)
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
