package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// The agent waits for its workers in Go's poller (a pidfd each), not with an
// OS thread blocked in wait(2) per worker: its thread count does not follow
// the worker count. A worker's end is still seen at once, with its exit
// status (SIGKILL, then a clean exit on SIGTERM) in the agent's log.
func TestAgentWaitsForWorkersWithoutAThreadEach(t *testing.T) {
	const instances = 12
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, instances, ""))
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	// Measured: 8 threads with 12 workers (the runtime's own); 19 and
	// more with a thread blocked per worker.
	if s := sampleProc(t, a.PID()); s.threads >= instances {
		t.Errorf("agent has %d threads with %d workers: a thread per worker", s.threads, instances)
	} else {
		t.Logf("agent with %d workers: %s", instances, s)
	}
	pids := PIDs(appOf(st, "web"))
	for slot, sig := range map[int]syscall.Signal{0: syscall.SIGKILL, 1: syscall.SIGTERM} {
		want := map[syscall.Signal]string{syscall.SIGKILL: `status="signal: killed"`, syscall.SIGTERM: `status="exit status 0"`}[sig]
		t0 := time.Now()
		if err := syscall.Kill(pids[slot], sig); err != nil {
			t.Fatal(err)
		}
		waitLogLine(t, a, fmt.Sprintf("slot %d's exit", slot), "worker exited, restarting", fmt.Sprintf("worker=%d", slot),
			fmt.Sprintf("pid=%d", pids[slot]), want)
		t.Logf("slot %d: %s to its exit in the log: %s", slot, sig, time.Since(t0).Round(time.Millisecond))
	}
	a.WaitFor("slots 0 and 1 replaced", 30*time.Second, func(st *api.Status) bool {
		p := PIDs(appOf(st, "web"))
		return AllReady(st, "web", instances) && p[0] != pids[0] && p[1] != pids[1]
	})
	if s := sampleProc(t, a.PID()); s.threads >= instances {
		t.Errorf("agent has %d threads with %d workers after 2 restarts", s.threads, instances)
	}
}
