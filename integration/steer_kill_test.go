package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestReloadAfterAgentKillWaitsForAdoptedSteeredSockets: after an agent
// SIGKILL on a steered pool the next agent serves on one survivor's
// socket, shared, while each other adopted worker still listens on its own
// socket of the dead agent's reuseport group, whose program keeps giving
// it connections. A reload must not return before those old workers closed
// theirs: here the v2 workers go on accepting for 3 s after their stop
// signal (a loaded worker runs its stop handler late), and once the reload
// returns only the workers status lists may listen on the port. Before the
// fix the reload looked only for the shared socket and returned while a v2
// worker, gone from status, still answered (issue 40).
func TestReloadAfterAgentKillWaitsForAdoptedSteeredSockets(t *testing.T) {
	needSteering(t)
	parallel(t)
	port := FreePort(t)
	const instances, extra = 2, steeredEven
	a := startSteered(t, port, instances)
	// A blue-green reload: both v2 workers hold a socket of their own.
	a.WriteConfig(versionedApp(port, instances, "v2", `TESTAPP_STOP_DELAY = "3s"`, extra))
	if r := a.CLI("reload", "web", "--strategy", "blue-green"); r.Code != 0 || !strings.Contains(r.Stderr, "web: cutover") {
		t.Fatalf("blue-green reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	st := a.WaitFor("v2 ready, v1 gone", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", instances) && len(appOf(st, "web").Draining) == 0
	})
	before := allWorkerPIDs(st)
	adoptAfterAgentKill(t, a, before, instances)
	onlyListedServe(t, a, port, "after the adoption")
	a.WriteConfig(versionedApp(port, instances, "v1", "", extra))
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	onlyListedServe(t, a, port, "once the reload returned")
	for p, v := range identities(t, port, PIDs(appOf(a.Status(), "web"))) {
		if v != "v1" {
			t.Errorf("worker %d answers %s after the reload", p, v)
		}
	}
}

// adoptAfterAgentKill SIGKILLs a's agent, starts the next one and waits
// until it serves with exactly the workers before, adopted.
func adoptAfterAgentKill(t *testing.T, a *Agent, before map[int]bool, instances int) {
	t.Helper()
	st := killAgentAndRestart(t, a, instances)
	if now := allWorkerPIDs(st); fmt.Sprint(keys(now)) != fmt.Sprint(keys(before)) {
		t.Fatalf("workers %v, before the kill %v: not adopted\n%s", keys(now), keys(before), a.Log())
	}
}

// startSteered starts an agent with web on port: instances workers of v1,
// balance = "even", and waits until they are ready.
func startSteered(t *testing.T, port, instances int) *Agent {
	t.Helper()
	a := NewAgentDir(t, bins, versionedApp(port, instances, "v1", "", steeredEven))
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	return a
}

// steeredEven is the app config line of a steered pool.
const steeredEven = `balance = "even"`
