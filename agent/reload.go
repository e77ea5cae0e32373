package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/deployd/deployd/internal/procstat"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
)

// Reload re-reads the config and moves the apps req names (every app when
// none) to it: a running app gets a reload (or with req.Canary a canary of
// that many workers), a new one is built and started, and one no longer in
// the config is stopped and removed. A config change goes one way: the
// config is loaded and checked (an invalid one changes nothing), the new
// apps are built, the app set swaps them in and takes out those that left,
// then the apps move and those that left stop. An error is a refusal before
// anything changed; otherwise the result says how each app ended. emit gets
// the progress of every app (concurrently: it must be safe for that).
func (a *Agent) Reload(_ context.Context, req api.ReloadRequest, by Caller, emit func(workers.Event)) (*api.Result, error) {
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		return nil, failWith(api.KindUsage, "%w", err)
	}
	if req.Canary < 0 {
		return nil, failWith(api.KindUsage, "canary %d: give the number of workers to hold on the new config, 1 or more", req.Canary)
	}
	cfg, err := config.Load(a.path)
	if err != nil {
		return nil, failWith(api.KindUsage, "the config is invalid; nothing was changed:\n%w", err)
	}
	p, err := a.planReload(cfg, req.Apps)
	if err != nil {
		return nil, err
	}
	for _, n := range p.names {
		if err := by.mayChange(cfg.Apps[n]); err != nil {
			return nil, err
		}
	}
	configNotices(a.log, a.settings, cfg, emit)
	added, results := a.buildApps(cfg, p.names)
	taken, removed := a.apps.swap(added, p.gone)
	for _, rt := range taken { // a concurrent reload added it first
		rt.discard()
		results[rt.name] = appResult(rt.name, workers.ErrBusy)
	}
	res := &api.Result{OK: true, Apps: a.moveApps(cfg, p.names, results, strategy, req.Canary, emit)}
	res.Apps = append(res.Apps, stopRemoved(a.state, removed, emit)...)
	for _, r := range res.Apps {
		if r.Outcome != api.OutcomeDone && r.Outcome != api.OutcomeHeld {
			res.OK = false
		}
	}
	return res, nil
}

// reloadPlan is what a reload does: the apps it moves to the config
// (names: running or new) and those it removes (gone).
type reloadPlan struct {
	names, gone []string
}

// planReload resolves the apps a reload names (every app of cfg when none)
// against cfg and the apps that run. Without names every running app no
// longer in cfg goes; with names, those named that left cfg.
func (a *Agent) planReload(cfg *config.Config, named []string) (reloadPlan, error) {
	names := slices.Compact(slices.Sorted(slices.Values(named)))
	all := len(names) == 0
	if all {
		names = cfg.AppNames
	}
	var p reloadPlan
	for _, n := range names {
		if _, ok := cfg.Apps[n]; ok {
			p.names = append(p.names, n)
			continue
		}
		if a.apps.get(n) == nil {
			return p, failWith(api.KindNotFound, "%s", unknownApp(n, cfg))
		}
		p.gone = append(p.gone, n)
	}
	if all {
		for _, rt := range a.apps.list() {
			if _, ok := cfg.Apps[rt.name]; !ok {
				p.gone = append(p.gone, rt.name)
			}
		}
	}
	return p, nil
}

// configNotices tells a reload what it does not apply (settings: the
// [agent] settings the agent started with), and the config's warnings.
func configNotices(log hclog.Logger, settings config.Agent, cfg *config.Config, emit func(workers.Event)) {
	// [agent] settings (socket, state_dir, log_dir, ...) are read at agent
	// start; a reload applies the apps only.
	if cfg.Agent != settings {
		log.Warn("[agent] settings changed in the config; they take effect at the next agent start or `deployd upgrade`")
		emit(workers.Event{Time: time.Now(), App: "agent", Type: workers.EventKind(api.EventNotice),
			Message: "[agent] settings changed; they take effect at the next agent start or `deployd upgrade`"})
	}
	for _, p := range cfg.Warnings {
		emit(workers.Event{Time: time.Now(), App: "config", Type: workers.EventKind(api.EventNotice), Message: p.String()})
	}
}

// buildApps builds the apps of names that the agent does not run yet
// (builder.app: listeners leased, logs open, nothing runs). An app that cannot
// be built gets its result.
func (a *Agent) buildApps(cfg *config.Config, names []string) ([]*appRT, map[string]api.AppResult) {
	var added []*appRT
	results := map[string]api.AppResult{}
	for _, n := range names {
		if a.apps.get(n) != nil {
			continue
		}
		rt, err := a.build.app(cfg, cfg.Apps[n])
		if err != nil {
			results[n] = appResult(n, err)
			continue
		}
		rt.unstarted.Store(true)
		added = append(added, rt)
	}
	return added, results
}

// moveApps moves each app of names that has no result yet to its config in
// cfg, apps in parallel: a new one starts, a running one reloads. The
// results come in the order of names.
func (a *Agent) moveApps(cfg *config.Config, names []string, done map[string]api.AppResult,
	strategy workers.Strategy, canary int, emit func(workers.Event)) []api.AppResult {
	results := make([]api.AppResult, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		if r, ok := done[n]; ok {
			results[i] = r
			continue
		}
		wg.Go(func() {
			t := time.Now()
			results[i] = a.reloadApp(cfg, cfg.Apps[n], strategy, canary, emit)
			results[i].DurationSeconds = time.Since(t).Seconds()
		})
	}
	wg.Wait()
	return results
}

// reloadApp moves app to its config in the file: a new app (just swapped
// in, never started) starts, a running one gets a reload, or with canary >
// 0 a canary of that many workers. Only an outcome of done (or a promoted
// canary) makes app the running config.
func (a *Agent) reloadApp(cfg *config.Config, app *config.App, strategy workers.Strategy, canary int, emit func(workers.Event)) api.AppResult {
	rt, done, _, err := a.admit(app.Name, rule{op: "reload"})
	if err != nil {
		return appResult(app.Name, err)
	}
	defer done()
	if rt.begin() {
		res := appResult(app.Name, rt.sup.Start())
		res.Release = rt.sup.Spec().Release
		return res
	}
	// The new spec's lease: listeners the running config shares stay open
	// through the reload, and those it adds close again unless it keeps them.
	lease, err := a.reg.Acquire(app.Name, wants(app, cfg.CheckSocketFolder))
	if err != nil {
		return appResult(app.Name, fmt.Errorf("%w; nothing was changed", err))
	}
	spec, err := a.build.spec(app, lease, a.state.get(app.Name).Current)
	if err != nil {
		lease.Release()
		return appResult(app.Name, fmt.Errorf("%w; nothing was changed", err))
	}
	scaledNotice(a.state, app, emit)
	if canary > 0 {
		return reloadCanary(rt, target{app: app, spec: spec, lease: lease}, strategy, canary, emit)
	}
	// The new workers' lines are written with the new [logs] settings;
	// a reload that does not go through puts the old ones back.
	old := rt.config()
	applyLogSettings(rt, old, app, emit)
	err = rt.sup.Reload(spec, strategy, emit)
	rt.settle(app, lease, err)
	if app.DiscoversListen() {
		a.learn.sync(app.Name, rt.running())
	}
	if err != nil {
		applyLogSettings(rt, app, old, discard)
	}
	res := appResult(app.Name, err)
	res.Release = spec.Release
	return res
}

// running reports whether the agent runs an app named name.
func (a *Agent) running(name string) bool { return a.apps.get(name) != nil }

// scaledNotice tells a reload of app that `deployd scale` set its count,
// which goes on overriding the config's instances.
func scaledNotice(state *stateFile, app *config.App, emit func(workers.Event)) {
	n := state.get(app.Name).Instances
	if n <= 0 || n == app.Instances {
		return
	}
	emit(workers.Event{Time: time.Now(), App: app.Name, Type: workers.EventKind(api.EventNotice), Message: api.ScaledMessage(app.Name, n, app.Instances)})
}

// stopRemoved stops the apps a reload took out of the app set. An app
// removed forgets its scale and stop (its releases stay), so one added
// again under its name starts from the config (state).
func stopRemoved(state *stateFile, gone []*appRT, emit func(workers.Event)) []api.AppResult {
	var out []api.AppResult
	for _, rt := range gone {
		t := time.Now()
		emit(workers.Event{Time: t, App: rt.name, Type: workers.EventKind(api.EventRemoved), Message: "no longer in the config; stopping"})
		rt.discard()
		if err := state.forget(rt.name); err != nil {
			rt.log.Error("removed app: its scaled count or stop stays recorded", "error", err)
		}
		out = append(out, api.AppResult{App: rt.name, Outcome: api.OutcomeDone, DurationSeconds: time.Since(t).Seconds()})
	}
	return out
}

// discard is an emit that nobody listens to.
func discard(workers.Event) {}

func unknownApp(name string, cfg *config.Config) string {
	known := strings.Join(cfg.AppNames, ", ")
	if known == "" {
		known = "none"
	}
	return fmt.Sprintf("unknown app %q; apps in %s: %s", name, cfg.Path, known)
}

// selfRSS is the agent's resident memory in bytes.
func selfRSS() int64 {
	st, err := procstat.FS{}.Stat(0)
	if err != nil {
		return 0
	}
	return st.RSSBytes()
}
