package dashboard

import (
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

func st(apps ...api.App) *api.Status { return &api.Status{Agent: api.Agent{PID: 1}, Apps: apps} }

func kinds(evs []Event) string {
	var k []string
	for _, e := range evs {
		k = append(k, e.Kind)
	}
	return strings.Join(k, " ")
}

func TestDiffReloadStep(t *testing.T) {
	prev := st(api.App{Name: "web", State: "running", Release: "v1", Workers: []api.Worker{
		{Slot: 0, PID: 10, State: "ready"}, {Slot: 1, PID: 11, State: "ready"}}})
	cur := st(api.App{Name: "web", State: "reloading", Release: "v1", Workers: []api.Worker{
		{Slot: 0, PID: 10, State: "draining"}, {Slot: 0, PID: 20, State: "ready", Release: "v2"}, {Slot: 1, PID: 11, State: "ready"}}})
	if got, want := kinds(diffStatus(prev, cur, 0)), "state draining started"; got != want {
		t.Errorf("events %q, want %q", got, want)
	}
	// The old worker left between two polls after it drained: an exit, not a crash.
	next := st(api.App{Name: "web", State: "running", Release: "v2", Workers: []api.Worker{
		{Slot: 0, PID: 20, State: "ready"}, {Slot: 1, PID: 21, State: "ready"}}})
	if got, want := kinds(diffStatus(cur, next, 0)), "state release exited exited started"; got != want {
		t.Errorf("events %q, want %q", got, want)
	}
}

func TestDiffCrashAndRestart(t *testing.T) {
	prev := st(api.App{Name: "web", State: "running", Workers: []api.Worker{{Slot: 0, PID: 10, State: "ready"}}})
	cur := st(api.App{Name: "web", State: "running", Restarts: 1, LastExit: "signal: killed",
		Workers: []api.Worker{{Slot: 0, PID: 30, State: "starting", Restarts: 1}}})
	evs := diffStatus(prev, cur, 0)
	if got, want := kinds(evs), "crash restart"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	if !strings.Contains(evs[0].Text, "signal: killed") || evs[1].PID != 30 {
		t.Errorf("events %+v", evs)
	}
	if evs := diffStatus(nil, cur, 0); len(evs) != 0 {
		t.Errorf("first poll: %+v, want nothing", evs)
	}
}

func TestAppendBounded(t *testing.T) {
	var s []int
	for i := range 10 {
		s = appendBounded(s, i, 3)
	}
	if len(s) != 3 || s[0] != 7 || s[2] != 9 {
		t.Errorf("got %v, want [7 8 9]", s)
	}
}
