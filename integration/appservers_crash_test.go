package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// An app whose workers exit at once becomes errored within a minute with
// the default restart settings (issue 17: it used to restart for minutes),
// and the text status shows its last exit status and last output line.
func TestDefaultsErrorACrashLoopWithinAMinute(t *testing.T) {
	parallel(t) // see parallel.go
	port := FreePort(t)
	t0 := time.Now()
	a := StartAgent(t, bins, appConfig("web", port, 2, `env = { TESTAPP_EXIT_BEFORE_READY = "7" }`))
	st := a.WaitFor("app errored", 75*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "errored" })
	took := time.Since(t0)
	t.Logf("errored %s after the agent started (default backoff, max_backoff, max_restarts, window)", took.Round(100*time.Millisecond))
	if took > time.Minute {
		t.Errorf("the crash loop took %s to end errored, want at most 1m with the defaults", took)
	}
	if app := appOf(st, "web"); !strings.Contains(app.LastExit, "exit status 7") {
		t.Errorf("last exit %q should name exit status 7", app.LastExit)
	}
	out := a.CLI("status").Stdout
	if !strings.Contains(out, "errored") || !strings.Contains(out, "exit status 7") ||
		!strings.Contains(out, "exiting with 7 before ready") {
		t.Errorf("the text status should say errored, the last exit status and the last output line:\n%s", out)
	}
}
