package agent

import (
	"fmt"
	"os"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

// Status is the agent's state and that of app (of every app when "").
func (a *Agent) Status(app string) (*api.Status, error) {
	st := &api.Status{Agent: api.Agent{
		Version: version.String(), PID: os.Getpid(), UptimeSeconds: time.Since(a.started).Seconds(),
		Config: a.path, Socket: a.socket, RSSBytes: selfRSS(),
	}, Apps: []api.App{}}
	for _, rt := range a.apps.list() {
		if app == "" || rt.name == app {
			s := appStatus(rt)
			s.Scaled = a.state.get(rt.name).Instances
			st.Apps = append(st.Apps, s)
		}
	}
	if app != "" && len(st.Apps) == 0 {
		return nil, failWith(api.KindNotFound, "%s", noSuchApp(a.path, a.apps.list(), app))
	}
	return st, nil
}

// AppFigures is what a metrics scrape reads of one app: its status and
// the supervisor's counters.
type AppFigures struct {
	Status   api.App
	Counters workers.Counters
	// BalanceAsked is the config's balance (Status.Balance is the one in
	// effect).
	BalanceAsked string
}

// Figures are every app's figures, sorted by app.
func (a *Agent) Figures() []AppFigures {
	var out []AppFigures
	for _, rt := range a.apps.list() {
		out = append(out, AppFigures{Status: appStatus(rt), Counters: rt.sup.Counters(), BalanceAsked: rt.config().Balance})
	}
	return out
}

func appStatus(rt *appRT) api.App {
	s := rt.sup.Status()
	state := string(s.State)
	if rt.config().Releases && s.Release == "" && len(s.Workers) == 0 {
		state = "no release"
	}
	app := api.App{Name: rt.name, State: state, Release: s.Release, Instances: s.Instances,
		Restarts: s.Restarts, LastExit: s.LastExit, LastLines: s.LastLines, Warnings: s.Warnings, Workers: []api.Worker{},
		DroppedLogLines: droppedLogLines(rt), Canary: apiCanary(s.Canary), LastCanary: apiCanaryEnd(s.LastCanary)}
	for _, l := range rt.config().Listen {
		app.Listen = append(app.Listen, l.URL)
	}
	for _, b := range rt.running().Learned() { // learned from the workers' own binds (learn.go)
		app.Listen = append(app.Listen, b.Name+" (discovered)")
	}
	app.Balance, app.Spares, app.Paused = s.Balance, s.Spares, apiPause(s.Paused)
	for _, q := range s.AcceptQueues {
		app.AcceptQueues = append(app.AcceptQueues, api.AcceptQueue{Listen: q.Listen, Queued: q.Queued, Backlog: q.Backlog})
	}
	if want := rt.config().Balance; want != s.Balance && want != "auto" && len(app.Listen) > 0 {
		app.Warnings = append(app.Warnings, fmt.Sprintf("balance %q asked, %q in effect (the agent log says why)", want, s.Balance))
	}
	for _, w := range s.Workers {
		app.Workers = append(app.Workers, apiWorker(w))
	}
	for _, w := range s.Draining {
		app.Draining = append(app.Draining, apiWorker(w))
	}
	return app
}

func apiWorker(w workers.WorkerStatus) api.Worker {
	aw := api.Worker{
		Slot: w.Slot, PID: w.PID, State: string(w.State), Release: w.Release, Generation: w.Generation,
		Restarts: w.Restarts, UptimeSeconds: w.Uptime.Seconds(),
		MemoryReplacements: w.MemoryReplacements, WatchdogReplacements: w.WatchdogReplacements, ReadyMillis: w.ReadyAfter.Milliseconds(),
		CPUPercent: w.CPUPercent, RSSBytes: w.RSSBytes, Status: w.Status,
		HealthReplacements: w.HealthReplacements, HealthFailures: w.HealthFailures,
		HealthFailuresTotal: w.HealthFailuresTotal, HealthError: w.HealthError, Connections: w.Connections,
		Spare: w.Spare, Socket: w.Socket,
	}
	if w.Steered {
		n := w.SteeredConnections
		aw.NewConnections = &n
	}
	if w.QueueKnown {
		q := w.Queued
		aw.Queued = &q
	}
	if w.Recycles {
		in := w.RecycleIn.Seconds()
		aw.RecycleInSeconds = &in
		aw.RecycleBy = w.RecycleBy
	}
	return aw
}
