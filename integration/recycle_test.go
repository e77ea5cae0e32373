package integration

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// TestRecycleAfterReplacesEveryWorkerUnderLoad: with recycle_after = "3s"
// every worker is replaced, twice over, one at a time and a new one ready
// first, under both loads at once: no failed request, never fewer ready
// workers than instances, never more than one extra worker.
func TestRecycleAfterReplacesEveryWorkerUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	const instances = 3
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, instances, `recycle_after = "3s"`))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	for _, w := range appOf(st, "web").Workers {
		if w.RecycleInSeconds == nil || *w.RecycleInSeconds > 3.3 {
			t.Errorf("worker %d: recycle_in_seconds %v, want at most 3.3 (3s and a tenth of jitter)", w.Slot, w.RecycleInSeconds)
		}
	}
	if r := a.CLI("status"); !strings.Contains(r.Stdout, "recycle_after: worker") {
		t.Errorf("status does not say which worker is recycled next:\n%s", r.Stdout)
	}
	recycledUnderLoad(t, a, st, instances, 3, func() func() (loadgen.Result, loadgen.Result) { // the original, then two recycles
		return startLoad(t, port, 20, 2*time.Minute)
	})
}

// TestRecycleAtRollsThePoolUnderLoad: with recycle_at = "*/10 * * * * *"
// (seconds first, as PM2's cron_restart takes it) every worker started
// before a scheduled time is replaced after it, one at a time and a new one
// ready first, under both loads at once: no failed request, never fewer
// ready workers than instances, never more than one extra worker. The
// whole pool falls due at the same time (no jitter), and status says so
// and by which setting.
func TestRecycleAtRollsThePoolUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	const instances = 3
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, instances, `recycle_at = "*/10 * * * * *"`))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	var due []float64
	for _, w := range appOf(st, "web").Workers {
		if w.RecycleInSeconds == nil || *w.RecycleInSeconds > 10 || w.RecycleBy != "recycle_at" {
			t.Fatalf("worker %d: recycle_in_seconds %v by %q, want at most 10 by recycle_at", w.Slot, w.RecycleInSeconds, w.RecycleBy)
		}
		due = append(due, *w.RecycleInSeconds)
	}
	if slices.Max(due)-slices.Min(due) > 0.001 {
		t.Errorf("workers due in %v s: a pool started together falls due at the same time", due)
	}
	if r := a.CLI("status"); !strings.Contains(r.Stdout, "recycle_at: worker") {
		t.Errorf("status does not say which worker is recycled next, and by which setting:\n%s", r.Stdout)
	}
	recycledUnderLoad(t, a, st, instances, 2, func() func() (loadgen.Result, loadgen.Result) { // the original, then its recycle
		return startLoad(t, port, 20, 2*time.Minute)
	})
	if !strings.Contains(a.Log(), `recycle_at="*/10 * * * * *"`) {
		t.Errorf("the agent log does not say recycle_at replaced the workers:\n%s", a.Log())
	}
}

// TestRecycleAtExpressTutorialApp: recycle_at on the tutorial's Express
// app as written (app.listen(3000), no shutdown code), 2 workers: each is
// replaced after a scheduled time, under both loads, nothing failed.
func TestRecycleAtExpressTutorialApp(t *testing.T) {
	parallelUnderLoad(t)
	const instances = 2
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": tutorialApp})
	a := StartAgent(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, instances, `recycle_at = "*/10 * * * * *"`))
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	recycledUnderLoad(t, a, st, instances, 2, func() func() (loadgen.Result, loadgen.Result) {
		return helloLoad(t, port, 20, 2*time.Minute)
	})
}

// recycledUnderLoad runs both loads (load starts them) until every slot
// of web (from status st on) had pids workers, all of instances ready
// again, then checks: no failed request, never fewer ready workers than
// instances, never more than one extra, and no restart (a recycle is a
// replacement).
func recycledUnderLoad(t *testing.T, a *Agent, st *api.Status, instances, pids int, load func() func() (loadgen.Result, loadgen.Result)) {
	t.Helper()
	stop := load()
	started := time.Now()
	pidsOf := map[int]map[int]bool{} // slot -> every pid it had
	for slot, pid := range PIDs(appOf(st, "web")) {
		pidsOf[slot] = map[int]bool{pid: true}
	}
	minReady, maxWorkers := instances, 0
	deadline := time.Now().Add(45 * time.Second)
	for {
		app := appOf(a.Status(), "web")
		ready := 0
		for _, w := range app.Workers {
			if w.State == "ready" {
				ready++
			}
			if pidsOf[w.Slot] == nil {
				pidsOf[w.Slot] = map[int]bool{}
			}
			pidsOf[w.Slot][w.PID] = true
		}
		minReady, maxWorkers = min(minReady, ready), max(maxWorkers, len(app.Workers))
		done := len(pidsOf) == instances && ready == instances
		for _, ps := range pidsOf {
			done = done && len(ps) >= pids
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 45s the slots had pids %v, want %d each\n%s", pidsOf, pids, a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	t.Logf("pids by slot %v in %s; fewest ready %d, most workers %d", pidsOf, time.Since(started).Round(time.Millisecond), minReady, maxWorkers)
	if minReady < instances {
		t.Errorf("%d ready workers at one point, want never fewer than %d", minReady, instances)
	}
	if maxWorkers > instances+1 {
		t.Errorf("%d workers at once, want at most %d: recycles must run one at a time", maxWorkers, instances+1)
	}
	if app := a.App("web"); app.Restarts != 0 {
		t.Errorf("%d restarts: a recycle is a replacement, not a crash", app.Restarts)
	}
}
