package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// killAgentAndRestart SIGKILLs the agent, starts the next one on the same
// folder and waits until instances workers of web are ready under it.
func killAgentAndRestart(t *testing.T, a *Agent, instances int) *api.Status {
	t.Helper()
	pid := a.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid, 10*time.Second)
	a.Start()
	return a.WaitFor("ready under the next agent", 60*time.Second, func(st *api.Status) bool {
		return st.Agent.PID != pid && AllReady(st, "web", instances)
	})
}

// TestAgentKillAdoptsNodeWorkers: a Node.js worker (the preload's channel
// at fd 50, ready = "node-ipc") is adopted after an agent SIGKILL with both
// channels: node still sees its IPC channel connected, and the adopted
// worker's crash is supervised (its slot restarts).
func TestAgentKillAdoptsNodeWorkers(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": ipcApp})
	a := NewAgentDir(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, 2, `ready = "node-ipc"`))
	a.Start()
	st := a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := slotPIDs(st, "web")
	st = killAgentAndRestart(t, a, 2)
	if got := slotPIDs(st, "web"); got[0] != before[0] || got[1] != before[1] {
		t.Fatalf("after the agent SIGKILL slots run %v, want the adopted %v\n%s", got, before, a.Log())
	}
	seen := map[int]string{}
	for i := 0; i < 200 && len(seen) < 2; i++ {
		body, err := get(t, port, "/ipc")
		if err != nil {
			t.Fatalf("GET /ipc: %v %s", err, body)
		}
		var pid int
		var conn, errCode string
		if _, err := fmt.Sscanf(body, "connected=%s err=%s pid=%d", &conn, &errCode, &pid); err != nil {
			t.Fatalf("GET /ipc: %q: %v", body, err)
		}
		seen[pid] = body
		if conn != "true" || errCode != "none" {
			t.Errorf("worker %d adopted after the SIGKILL: %q, want its IPC channel connected", pid, body)
		}
	}
	// Crash supervision: the adopted worker's exit is seen, its slot restarts.
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = a.WaitFor("slot 0 restarted", 60*time.Second, func(st *api.Status) bool {
		p := slotPIDs(st, "web")[0]
		return p != 0 && p != before[0] && AllReady(st, "web", 2)
	})
	t.Logf("node workers %v adopted after the agent SIGKILL, IPC connected; slot 0 crashed and restarted as %d",
		before, slotPIDs(st, "web")[0])
}

// TestAgentKillResumesHealthChecks: after an agent SIGKILL the next agent
// adopts workers with a health socket and probes them again: a worker whose
// health path hangs is replaced, the other one kept.
func TestAgentKillResumesHealthChecks(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	const instances = 2
	health := "[apps.web.health]\ninterval = \"500ms\"\ntimeout = \"500ms\"\nfailures = 3\n"
	a := NewAgentDir(t, bins, healthApp(port, instances, "v1", "", health))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := PIDs(appOf(st, "web"))
	st = killAgentAndRestart(t, a, instances)
	if got := PIDs(appOf(st, "web")); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("after the agent SIGKILL workers %v, want the adopted %v\n%s", got, before, a.Log())
	}
	body, err := get(t, port, "/sick")
	if err != nil {
		t.Fatalf("GET /sick: %v", err)
	}
	var ver string
	var sick, slot int
	if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &sick, &slot); err != nil {
		t.Fatalf("GET /sick body %q: %v", body, err)
	}
	st = a.WaitFor("the hung worker replaced", 30*time.Second, func(st *api.Status) bool {
		ps := PIDs(appOf(st, "web"))
		return ps[slot] != 0 && ps[slot] != sick && AllReady(st, "web", instances)
	})
	for s, pid := range before {
		if s != slot && PIDs(appOf(st, "web"))[s] != pid {
			t.Errorf("the healthy adopted worker %d was replaced", s)
		}
	}
	t.Logf("workers %v adopted after the agent SIGKILL; the one whose health path hung (slot %d) was replaced", before, slot)
}
