package integration

import (
	"maps"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestAgentKillsAdoptWorkersUnderLoad SIGKILLs the agent five times under
// both loads, each time starting a new agent on the same config: every
// worker (an app whose SIGTERM cuts its connections, logging a numbered
// line every 20 ms) keeps serving and logging while no agent runs, and the
// next agent adopts it: no failed request, the same pids throughout, every
// tick line in the log exactly once.
func TestAgentKillsAdoptWorkersUnderLoad(t *testing.T) {
	port := FreePort(t)
	const instances, kills = 2, 5
	a := NewAgentDir(t, bins, abruptApp(port, instances, ""))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := allWorkerPIDs(st)
	stop := startLoad(t, port, 4, 2*time.Minute)
	var worst time.Duration
	for i := range kills {
		pid := a.PID()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitExited(t, pid, 10*time.Second)
		t0 := time.Now()
		a.Start()
		st = a.WaitFor("workers adopted", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
		d := time.Since(t0)
		worst = max(worst, d)
		if now := allWorkerPIDs(st); !maps.Equal(now, before) {
			t.Fatalf("kill %d: workers %v, before the kill %v: not adopted\n%s", i+1, keys(now), keys(before), a.Log())
		}
		if r := appOf(st, "web").Restarts; r != 0 {
			t.Errorf("kill %d: %d restarts: a worker was replaced", i+1, r)
		}
		t.Logf("kill %d: agent %d SIGKILLed; the next agent serves with the same %d workers %s after its start",
			i+1, pid, len(before), d.Round(time.Millisecond))
	}
	ka, nka := stop()
	requireNoFailures(t, "5 agent SIGKILLs", ka, nka)
	a.Stop()
	lost := checkTicksAcrossKills(t, ticks(t, a.Dir), before, kills)
	t.Logf("%d agent SIGKILLs: same pids %v, slowest new agent serving %s after its start, %d tick lines lost",
		kills, keys(before), worst.Round(time.Millisecond), lost)
}

// maxLostPerKill bounds the tick lines of one worker an agent SIGKILL may
// lose: those the killed agent had read from the pipe and not yet written
// to the file (its sink's queue). What no agent read waits in the pipe for
// the next one: never lost, never repeated.
const maxLostPerKill = 25

// checkTicksAcrossKills fails if a tick line of a worker in pids is
// repeated, or if more than maxLostPerKill lines per kill are missing; it
// returns how many are missing in all.
func checkTicksAcrossKills(t *testing.T, counts map[int]map[int]int, pids map[int]bool, kills int) (lost int) {
	t.Helper()
	for pid := range pids {
		c := counts[pid]
		top := 0
		for n := range c {
			top = max(top, n)
		}
		var missing, dup []int
		for n := 1; n <= top; n++ {
			switch c[n] {
			case 0:
				missing = append(missing, n)
			case 1:
			default:
				dup = append(dup, n)
			}
		}
		lost += len(missing)
		switch {
		case top == 0:
			t.Errorf("worker %d: no tick line in the log", pid)
		case len(dup) > 0 || len(missing) > maxLostPerKill*kills:
			t.Errorf("worker %d: of ticks 1..%d, missing %v, repeated %v", pid, top, missing, dup)
		default:
			t.Logf("worker %d: ticks 1..%d, none repeated, missing %v", pid, top, missing)
		}
	}
	return lost
}
