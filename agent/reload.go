package agent

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/deployd/deployd/internal/procstat"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
)

func (a *Agent) handleReload(w http.ResponseWriter, r *http.Request) {
	var req api.ReloadRequest
	if !decode(w, r, &req) {
		return
	}
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Canary < 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("canary %d: give the number of workers to hold on the new config, 1 or more", req.Canary))
		return
	}
	cfg, err := config.Load(a.path)
	if err != nil {
		writeError(w, http.StatusBadRequest, "the config is invalid; nothing was changed:\n"+err.Error())
		return
	}
	// [agent] settings (socket, state_dir, log_dir, ...) are read at agent
	// start; a reload applies the apps only.
	agentChanged := cfg.Agent != a.settings
	names := slices.Compact(slices.Sorted(slices.Values(req.Apps)))
	all := len(names) == 0
	if all {
		names = cfg.AppNames
	}
	var gone []string // named, running, no longer in the config: removed
	for _, n := range names {
		if _, ok := cfg.Apps[n]; !ok {
			if !a.running(n) {
				writeError(w, http.StatusNotFound, unknownApp(n, cfg))
				return
			}
			gone = append(gone, n)
		}
	}
	names = slices.DeleteFunc(names, func(n string) bool { return slices.Contains(gone, n) })
	if ok, why := mayReload(peerOf(r.Context()), cfg, names); !ok {
		writeError(w, http.StatusForbidden, why)
		return
	}
	// After the privilege check: a discovery runs the app's code.
	if err := a.discoverListens(cfg, names, true); err != nil {
		writeError(w, http.StatusBadRequest, err.Error()+"; nothing was changed")
		return
	}
	st := newStream(w)
	if agentChanged {
		a.log.Warn("[agent] settings changed in the config; they take effect at the next agent start or `deployd upgrade`")
		st.event(workers.Event{Time: time.Now(), App: "agent", Type: workers.EventKind(api.EventNotice),
			Message: "[agent] settings changed; they take effect at the next agent start or `deployd upgrade`"})
	}
	for _, p := range cfg.Warnings {
		st.event(workers.Event{Time: time.Now(), App: "config", Type: workers.EventKind(api.EventNotice), Message: p.String()})
	}
	results := a.reloadApps(cfg, names, strategy, req.Canary, st.event)
	if all || len(gone) > 0 {
		results = append(results, a.removeApps(cfg, gone, st.event)...)
	}
	res := &api.Result{OK: true, Apps: results}
	for _, r := range results {
		if r.Outcome != api.OutcomeDone && r.Outcome != api.OutcomeHeld {
			res.OK = false
		}
	}
	st.send(api.StreamLine{Result: res})
}

// reloadApps moves each named app to its config in cfg, apps in parallel.
func (a *Agent) reloadApps(cfg *config.Config, names []string, strategy workers.Strategy, canary int, emit func(workers.Event)) []api.AppResult {
	results := make([]api.AppResult, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			results[i] = a.reloadApp(cfg.Apps[n], strategy, canary, emit)
			results[i].DurationSeconds = time.Since(t).Seconds()
		}()
	}
	wg.Wait()
	return results
}

// reloadApp moves app to its config in the file: a new app starts, a
// running one gets a reload, or with canary > 0 a canary of that many
// workers. Only an outcome of done (or a promoted canary) makes app the
// running config.
func (a *Agent) reloadApp(app *config.App, strategy workers.Strategy, canary int, emit func(workers.Event)) api.AppResult {
	a.mu.Lock()
	rt := a.apps[app.Name]
	a.mu.Unlock()
	if rt == nil { // a new app: start it
		return a.addApp(app)
	}
	if !rt.busy.TryLock() {
		return appResult(app.Name, workers.ErrBusy)
	}
	defer rt.busy.Unlock()
	// The new spec's lease: listeners the running config shares stay open
	// through the reload, and those it adds close again unless it keeps them.
	lease, err := a.reg.Acquire(app.Name, wants(app))
	if err != nil {
		return appResult(app.Name, fmt.Errorf("%w; nothing was changed", err))
	}
	spec, err := a.specFor(app, lease.Bound(), a.state.get(app.Name).Current)
	if err != nil {
		lease.Release()
		return appResult(app.Name, fmt.Errorf("%w; nothing was changed", err))
	}
	a.scaledNotice(app, emit)
	if canary > 0 {
		return a.reloadCanary(rt, app, lease, spec, strategy, canary, emit)
	}
	// The new workers' lines are written with the new [logs] settings;
	// a reload that does not go through puts the old ones back.
	old := rt.config()
	a.applyLogSettings(rt, old, app, emit)
	err = rt.sup.Reload(spec, strategy, emit)
	rt.settle(app, lease, err)
	if err != nil {
		a.applyLogSettings(rt, app, old, func(workers.Event) {})
	}
	res := appResult(app.Name, err)
	res.Release = spec.Release
	return res
}

// addApp builds the supervisor of an app that is new in the config, outside
// a.mu (newApp leases listeners and opens logs), then records it and starts
// it; a concurrent reload that added it first wins and this one is busy.
func (a *Agent) addApp(app *config.App) api.AppResult {
	nrt, err := a.newApp(app)
	if err != nil {
		return appResult(app.Name, err)
	}
	a.mu.Lock()
	_, taken := a.apps[app.Name]
	if !taken {
		a.apps[app.Name] = nrt
	}
	a.mu.Unlock()
	if taken {
		nrt.closeLogs()
		nrt.release()
		return appResult(app.Name, workers.ErrBusy)
	}
	res := appResult(app.Name, nrt.sup.Start())
	res.Release = nrt.sup.Spec().Release
	return res
}

// running reports whether the agent runs an app named name.
func (a *Agent) running(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.apps[name] != nil
}

// scaledNotice tells a reload of app that `deployd scale` set its count,
// which goes on overriding the config's instances.
func (a *Agent) scaledNotice(app *config.App, emit func(workers.Event)) {
	n := a.state.get(app.Name).Instances
	if n <= 0 || n == app.Instances {
		return
	}
	emit(workers.Event{Time: time.Now(), App: app.Name, Type: workers.EventKind(api.EventNotice), Message: api.ScaledMessage(app.Name, n, app.Instances)})
}

// removeApps stops apps that are no longer in cfg: every such app when
// only is empty, else those named in only. An app removed forgets its
// scale and stop (its releases stay), so one added again under its name
// starts from the config.
func (a *Agent) removeApps(cfg *config.Config, only []string, emit func(workers.Event)) []api.AppResult {
	a.mu.Lock()
	var gone []*appRT
	for n, rt := range a.apps {
		if len(only) > 0 && !slices.Contains(only, n) {
			continue
		}
		if _, ok := cfg.Apps[n]; !ok {
			gone = append(gone, rt)
			delete(a.apps, n)
		}
	}
	a.mu.Unlock()
	var out []api.AppResult
	for _, rt := range gone {
		t := time.Now()
		emit(workers.Event{Time: t, App: rt.name, Type: workers.EventKind(api.EventRemoved), Message: "no longer in the config; stopping"})
		rt.sup.Stop()
		rt.closeLogs()
		rt.release()
		if err := a.state.forget(rt.name); err != nil {
			a.log.Error("removed app: its scaled count or stop stays recorded", "app", rt.name, "error", err)
		}
		out = append(out, api.AppResult{App: rt.name, Outcome: api.OutcomeDone, DurationSeconds: time.Since(t).Seconds()})
	}
	return out
}

func unknownApp(name string, cfg *config.Config) string {
	known := strings.Join(cfg.AppNames, ", ")
	if known == "" {
		known = "none"
	}
	return fmt.Sprintf("unknown app %q; apps in %s: %s", name, cfg.Path, known)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return slices.Clip(keys)
}

// selfRSS is the agent's resident memory in bytes.
func selfRSS() int64 {
	st, err := procstat.FS{}.Stat(0)
	if err != nil {
		return 0
	}
	return st.RSSBytes()
}
