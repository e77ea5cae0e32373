package integration

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// learnApp writes down each run of its code (a line with its pid in
// runs), then serves its pid on port from its own listen(port).
const learnApp = `require('fs').appendFileSync(%q, process.pid + '\n');
require('http').createServer((q, r) => r.end('pid=' + process.pid + '\n')).listen(%d, '127.0.0.1');
`

// A Node.js app without a listen list learns its port from its own bind in
// its real workers: its code runs once per worker start and no more (no
// run only to find the port), and status names the socket the agent keeps
// for it. After an agent SIGKILL the next agent adopts the same workers
// and takes the learned socket back from one, so a worker that restarts
// afterwards binds the same port, is answered with the same socket, and
// serves beside the adopted one.
func TestNodeLearnedListenRunsNoExtraStartAndSurvivesAgentKill(t *testing.T) {
	parallel(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	port := FreePort(t)
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	if err := os.WriteFile(filepath.Join(dir, "app.js"), []byte(fmt.Sprintf(learnApp, runs, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, fmt.Sprintf(`[apps.web]
command = [%q, "app.js"]
cwd = %q
instances = 2
ready_timeout = "20s"
stop_timeout = "5s"
`, node, dir))
	a.Start()
	a.WaitFor("2 ready", time.Minute, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	mustRun(t, a.CLIWithin(2*time.Minute, "reload", "web"), "reload web")
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "\n") != 4 {
		t.Errorf("the app's code ran %d times for a start and a reload of 2 workers, want 4:\n%s", strings.Count(string(b), "\n"), b)
	}
	want := fmt.Sprintf("tcp://127.0.0.1:%d (discovered)", port)
	if got := a.App("web").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("status listen = %q, want [%q]", got, want)
	}

	before := PIDs(a.App("web"))
	if err := syscall.Kill(a.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.AwaitExit(t)
	a.Start()
	a.WaitFor("2 ready after the agent's SIGKILL", time.Minute, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if after := PIDs(a.App("web")); !maps.Equal(before, after) {
		t.Fatalf("the next agent did not adopt the workers: before %v, after %v", before, after)
	}
	if !strings.Contains(a.Log(), "adopted socket from a worker left by a dead agent") {
		t.Errorf("the next agent did not take the learned socket back from a worker:\n%s", a.Log())
	}

	// A worker that starts now binds the port again and gets the same socket.
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := a.WaitFor("worker 0 restarted", time.Minute, func(st *api.Status) bool {
		return AllReady(st, "web", 2) && PIDs(appOf(st, "web"))[0] != before[0]
	})
	fresh := PIDs(appOf(st, "web"))[0]
	seen := map[string]bool{}
	for range 200 {
		body, err := get(t, port, "/")
		if err != nil {
			t.Fatalf("GET / after the restart: %v", err)
		}
		seen[strings.TrimSpace(body)] = true
		if seen[fmt.Sprintf("pid=%d", fresh)] && seen[fmt.Sprintf("pid=%d", before[1])] {
			break
		}
	}
	if !seen[fmt.Sprintf("pid=%d", fresh)] || !seen[fmt.Sprintf("pid=%d", before[1])] {
		t.Errorf("answers came from %v; want the restarted worker %d and the adopted one %d on the one port", seen, fresh, before[1])
	}
	if got := a.App("web").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("after the agent's SIGKILL, status listen = %q, want [%q]", got, want)
	}
}
