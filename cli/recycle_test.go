package cli

import (
	"bytes"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// TestPrintRecycleNamesTheOldestOfATie: recycle_at gives a pool one due
// time; the agent takes the oldest worker first, and status names that
// one, with the setting.
func TestPrintRecycleNamesTheOldestOfATie(t *testing.T) {
	in := func(s float64) *float64 { return &s }
	app := api.App{Name: "web", Workers: []api.Worker{
		{Slot: 0, PID: 10, UptimeSeconds: 5, RecycleInSeconds: in(60), RecycleBy: "recycle_at"}, // restarted after a crash
		{Slot: 1, PID: 11, UptimeSeconds: 900, RecycleInSeconds: in(60), RecycleBy: "recycle_at"},
		{Slot: 2, PID: 12, UptimeSeconds: 800, RecycleInSeconds: in(60), RecycleBy: "recycle_at"},
		{Slot: 3, PID: 13, UptimeSeconds: 9000}, // a worker recycling does not apply to
	}}
	var out bytes.Buffer
	printRecycle(&out, app)
	if want := "\nweb: recycle_at: worker 1 (pid 11) is replaced next, in 1m0s\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	app.Workers[2].RecycleInSeconds = in(30) // due earlier, though younger
	app.Workers[2].RecycleBy = "recycle_after"
	out.Reset()
	printRecycle(&out, app)
	if want := "\nweb: recycle_after: worker 2 (pid 12) is replaced next, in 30s\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
