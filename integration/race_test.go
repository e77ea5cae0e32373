package integration

import (
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestReloadDuringCrashRestartIsRaceFree reloads an app after one of its
// workers was restarted by the supervisor (a crash restart reads the
// listeners from the supervisor's goroutine, a reload prepares the next
// spec's listeners in a request goroutine). With DEPLOYD_TEST_RACE=1 the
// agent runs under the race detector and checkRace fails the test on a
// report; without it the test still checks the reload.
func TestReloadDuringCrashRestartIsRaceFree(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, ""))
	st := a.WaitFor("2 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	for round := range 3 {
		before := PIDs(appOf(st, "web"))
		if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st = a.WaitFor("slot 0 replaced and ready", 20*time.Second, func(st *api.Status) bool {
			p := PIDs(appOf(st, "web"))
			return AllReady(st, "web", 2) && p[0] != before[0] && p[0] != 0
		})
		if r := a.CLI("reload", "web"); r.Code != 0 {
			t.Fatalf("round %d: reload: exit %d\n%s%s", round, r.Code, r.Stdout, r.Stderr)
		}
		st = a.WaitFor("2 ready workers after the reload", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	}
}
