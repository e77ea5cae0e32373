package integration

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// selfBindBin is integration/selfbind (a Go server that binds its own
// port and calls Shutdown on SIGTERM), built once per run.
var selfBindBin = sync.OnceValues(func() (string, error) {
	return Build(bins.Dir, "selfbind", "./integration/selfbind", "")
})

// selfBindApp is the config a user writes for such a server: command,
// instances, listen and PORT; nothing about how it gets its socket.
func selfBindApp(t *testing.T, port, instances int, ver string) string {
	t.Helper()
	bin, err := selfBindBin()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`[apps.web]
command = [%q]
instances = %d
listen = ["tcp://127.0.0.1:%d"]
user = "nobody"
stop_timeout = "15s"
env = { PORT = "%d", APP_VERSION = %q }
`, bin, instances, port, port, ver)
}

// Two unmodified self-binding Go servers (ListenAndServe(":PORT"),
// Shutdown on SIGTERM, run as nobody) serve one port through the agent's
// socket, and each new release binds while the old one serves: over 5
// reloads under a keep-alive and a new-connection load at once no
// connection is refused or reset. Then an agent upgrade and an agent
// SIGKILL keep the same pids with no failed request at all, and the agent
// after the SIGKILL answers the binds of a reload's new workers.
//
// A reload's failed requests are the app's own: Go's Shutdown closes,
// unanswered, a connection it accepted before the signal and reads after
// it (net/http conn.serve: "if c.server.shuttingDown() { return }"), and
// closes idle kept-alive connections under their client. They are counted
// and logged, not failed, as with the same server on an inherited fd 3:
// the drains issue makes them the agent's business (a quiet stop).
func TestSelfBindingGoServersReloadUpgradeAndAgentKill(t *testing.T) {
	parallelUnderLoad(t)
	const instances, reloads = 2, 5
	port := FreePort(t)
	a := NewAgentDir(t, bins, selfBindApp(t, port, instances, "v1"))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	for _, w := range appOf(st, "web").Workers {
		if w.Socket != "answered bind (1 of 3 binds took the agent's socket)" {
			t.Errorf("worker %d: socket %q, want its bind answered (and Go's 2 probe binds left alone)\n%s", w.PID, w.Socket, a.Log())
		}
	}
	for pid, v := range identities(t, port, PIDs(appOf(st, "web"))) {
		if v != "v1" {
			t.Fatalf("worker %d answers %s, want v1", pid, v)
		}
	}
	reloadsUnderLoad(t, a, port, instances, 2, reloads)

	before := allWorkerPIDs(a.WaitFor("the old workers to drain", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", instances) && len(appOf(st, "web").Draining) == 0
	}))
	stop := startLoad(t, port, 20, 3*time.Minute)
	upgradeBy(t, a, "cli")
	st = a.WaitFor("ready after the upgrade", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	if got := allWorkerPIDs(st); !samePIDs(got, before) {
		t.Fatalf("after the upgrade: worker pids %v, want %v\n%s", keys(got), keys(before), a.Log())
	}
	// SIGKILL the agent the upgrade started (not the test's child).
	pid, _ := agentPID(t, a)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid, 10*time.Second)
	a.Start()
	st = a.WaitFor("ready under the next agent", 60*time.Second, func(st *api.Status) bool {
		return st.Agent.PID != pid && AllReady(st, "web", instances)
	})
	if got := allWorkerPIDs(st); !samePIDs(got, before) {
		t.Fatalf("after the agent SIGKILL: worker pids %v, want %v\n%s", keys(got), keys(before), a.Log())
	}
	ka, nka := stop()
	requireNoFailures(t, "upgrade and SIGKILL", ka, nka)

	reloadsUnderLoad(t, a, port, instances, 9, 1)
}

// reloadsUnderLoad reloads web n times (versions from vFirst) under both
// loads: no connection refused or reset, every worker on the new version
// after each; the app's own failures are logged.
func reloadsUnderLoad(t *testing.T, a *Agent, port, instances, first, n int) {
	t.Helper()
	stop := startLoad(t, port, 20, 3*time.Minute)
	for i := range n {
		ver := fmt.Sprintf("v%d", first+i)
		r, took := reloadTo(a, "web", selfBindApp(t, port, instances, ver))
		if r.Code != 0 {
			t.Fatalf("reload to %s: exit %d\n%s\n%s", ver, r.Code, r.Stderr, a.Log())
		}
		t.Logf("reload to %s took %s", ver, took.Round(time.Millisecond))
		for pid, v := range identities(t, port, PIDs(a.App("web"))) {
			if v != ver {
				t.Errorf("after the reload to %s, worker %d answers %s", ver, pid, v)
			}
		}
	}
	ka, nka := stop()
	for _, r := range []struct {
		what string
		res  loadgen.Result
	}{{"keep-alive", ka}, {"new-connection", nka}} {
		t.Logf("%d reloads, %s clients: %s; failures (Go Shutdown's own): %v", n, r.what, r.res, r.res.Errors)
		if r.res.Requests == 0 || r.res.Refused != 0 || r.res.ConnectErrors != 0 {
			t.Errorf("%d reloads, %s clients: %s: want requests and no connection refused or reset", n, r.what, r.res)
		}
	}
}
