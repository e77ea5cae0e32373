package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

func TestPoolServesOnePortWithDistinctWorkers(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 3, ""))
	st := a.WaitFor("3 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 3) })
	pids := PIDs(appOf(st, "web"))
	distinct := map[int]bool{}
	for _, p := range pids {
		distinct[p] = true
	}
	if len(distinct) != 3 {
		t.Fatalf("want 3 distinct pids, got %v", pids)
	}
	seen := identities(t, port, pids)
	for _, pid := range pids {
		if _, ok := seen[pid]; !ok {
			t.Errorf("worker pid %d never answered on the shared port (seen %v)", pid, seen)
		}
	}
	// An app that takes fd 3 keeps the one shared socket under the default
	// balance (auto): only a bind of its own would give it a socket each.
	app := appOf(a.Status(), "web")
	if app.Balance != "shared" {
		t.Errorf("balance %q, want shared for an app that takes fd 3", app.Balance)
	}
	for _, w := range app.Workers {
		if !strings.HasPrefix(w.Socket, "inherited fd") {
			t.Errorf("worker %d: socket %q, want inherited fd", w.PID, w.Socket)
		}
	}
}

func TestReadinessModes(t *testing.T) {
	parallel(t)
	for _, tc := range []struct{ name, ready, env string }{
		{"notify", "notify", ""},
		{"notify-from-child", "notify", `TESTAPP_NOTIFY_FROM_CHILD = "true"`},
		{"node-ipc", "node-ipc", `TESTAPP_READY = "node-ipc"`},
		{"log", `log:listening ready version=\S+`, `TESTAPP_READY = "log"`},
		{"delay", "delay:300ms", `TESTAPP_READY = "delay"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := FreePort(t)
			env := `TESTAPP_STARTUP_DELAY = "200ms"`
			if tc.env != "" {
				env += ", " + tc.env
			}
			extra := fmt.Sprintf("ready = '%s'\nenv = { %s }\n", tc.ready, env)
			a := StartAgent(t, bins, appConfig("web", port, 2, extra))
			st := a.WaitFor("2 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
			for _, w := range appOf(st, "web").Workers {
				if w.ReadyMillis < 150 {
					t.Errorf("worker %d ready after %d ms, before the app's 200 ms startup delay", w.Slot, w.ReadyMillis)
				}
			}
			if _, err := get(t, port, "/"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNeverReadyWorkerStaysStarting(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 1, `env = { TESTAPP_NEVER_READY = "true" }`))
	// The app serves, so once it answers it has had every chance to say READY=1.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := get(t, port, "/"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("app never served")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w := a.App("web").Workers; len(w) != 1 || w[0].State != "starting" {
		t.Fatalf("a worker that never said READY=1 must stay starting, got %+v", w)
	}
	// The agent is still waiting for readiness (ready_timeout 10s): SIGTERM
	// must still stop it at once.
	t0 := time.Now()
	a.Signal(syscall.SIGTERM)
	select {
	case <-a.Done():
	case <-time.After(8 * time.Second):
		t.Fatalf("agent still running 8s after SIGTERM during startup\n%s", a.Log())
	}
	if a.ExitCode() != 0 {
		t.Errorf("exit code %d after SIGTERM during startup", a.ExitCode())
	}
	t.Logf("stopped %s after SIGTERM during startup", time.Since(t0).Round(time.Millisecond))
}

func TestCrashedWorkerIsReplacedInItsSlot(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, ""))
	st := a.WaitFor("2 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	t0 := time.Now()
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = a.WaitFor("slot 0 replaced and ready", 20*time.Second, func(st *api.Status) bool {
		p := PIDs(appOf(st, "web"))
		return AllReady(st, "web", 2) && p[0] != before[0] && p[0] != 0
	})
	t.Logf("SIGKILL to replacement ready: %s", time.Since(t0).Round(time.Millisecond))
	after := PIDs(appOf(st, "web"))
	if after[1] != before[1] {
		t.Errorf("slot 1 must keep its worker: before %d, after %d", before[1], after[1])
	}
	if appOf(st, "web").Workers[0].Restarts != 1 {
		t.Errorf("slot 0 restarts = %d, want 1", appOf(st, "web").Workers[0].Restarts)
	}
	seen := identities(t, port, after)
	if len(seen) != 2 {
		t.Errorf("both workers must serve after the restart, saw %v", seen)
	}
}

// fdFlags reads the file-status flags of pid's fd 3 as the process sees them.
func fdFlags(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/3", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			f, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no flags in fdinfo of %d", pid)
	return 0
}

func TestListenerFlagsSurviveRestarts(t *testing.T) {
	parallel(t)
	// sleep never touches its fd 3, so /proc/PID/fdinfo/3 shows the flags
	// exactly as the agent handed the socket over. (A Go worker would set
	// O_NONBLOCK itself, as it does under systemd.)
	for _, nonblocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("nonblocking=%v", nonblocking), func(t *testing.T) {
			port := FreePort(t)
			a := StartAgent(t, bins, fmt.Sprintf(`[apps.web]
command = ["/bin/sleep", "600"]
instances = 2
listen = ["tcp://127.0.0.1:%d"]
ready = "delay:50ms"
nonblocking = %v
[apps.web.restart]
backoff = "10ms"
`, port, nonblocking))
			st := a.WaitFor("2 ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
			before := PIDs(appOf(st, "web"))
			flags := fdFlags(t, before[1])
			if got := flags&syscall.O_NONBLOCK != 0; got != nonblocking {
				t.Errorf("fd 3 flags %o: O_NONBLOCK set = %v, want %v", flags, got, nonblocking)
			}
			for i := 0; i < 3; i++ {
				p0 := PIDs(appOf(a.Status(), "web"))[0]
				syscall.Kill(p0, syscall.SIGKILL)
				st = a.WaitFor("slot 0 replaced", 20*time.Second, func(st *api.Status) bool {
					p := PIDs(appOf(st, "web"))
					return AllReady(st, "web", 2) && p[0] != p0
				})
				if got := fdFlags(t, before[1]); got != flags {
					t.Errorf("restart %d changed the running worker's fd 3 flags from %o to %o", i, flags, got)
				}
				if got := fdFlags(t, PIDs(appOf(st, "web"))[0]); got != flags {
					t.Errorf("restart %d: new worker's fd 3 flags %o, running worker's %o", i, got, flags)
				}
			}
		})
	}
}

func TestCrashLoopMakesAppErrored(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 1, `env = { TESTAPP_EXIT_BEFORE_READY = "7" }
[apps.web.restart]
backoff = "10ms"
max_backoff = "50ms"
max_restarts = 3
window = "1m"`))
	st := a.WaitFor("app errored", 30*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "errored" })
	app := appOf(st, "web")
	if !strings.Contains(app.LastExit, "exit status 7") {
		t.Errorf("last exit %q should name exit status 7", app.LastExit)
	}
	if len(app.LastLines) == 0 {
		t.Errorf("errored status should carry the worker's last output lines")
	}
	r := a.CLI("status")
	if !strings.Contains(r.Stdout, "errored") || !strings.Contains(r.Stdout, "deployd restart web") {
		t.Errorf("status should say errored and how to restart:\n%s", r.Stdout)
	}
	// Fix the app and restart it.
	a.WriteConfig(appConfig("web", port, 1, ""))
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload of the fixed app: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	a.WaitFor("running again", 20*time.Second, func(st *api.Status) bool {
		return appOf(st, "web").State == "running" && AllReady(st, "web", 1)
	})
}

func TestRestartCommandClearsErrored(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	marker := t.TempDir() + "/fixed"
	// The app crashes until the marker file exists.
	a := StartAgent(t, bins, fmt.Sprintf(`[apps.web]
command = ["/bin/sh", "-c", "test -e %s || exit 3; exec %%TESTAPP%%"]
instances = 1
listen = ["tcp://127.0.0.1:%d"]
[apps.web.restart]
backoff = "10ms"
max_restarts = 2
`, marker, port))
	a.WaitFor("app errored", 30*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "errored" })
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := a.CLI("restart", "web"); r.Code != 0 {
		t.Fatalf("restart: exit %d\n%s", r.Code, r.Stderr)
	}
	st := a.Status()
	if appOf(st, "web").State != "running" || !AllReady(st, "web", 1) {
		t.Fatalf("after restart: %+v", appOf(st, "web"))
	}
}

func TestAgentSIGTERMStopsEverything(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, "")+`[apps.side]
command = ["%TESTAPP%"]
instances = 1
listen = ["unix://%DIR%/side.sock"]
`)
	sockPath := filepath.Join(a.Dir, "side.sock")
	st := a.WaitFor("workers ready", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 2) && AllReady(st, "side", 1)
	})
	var pids []int
	for _, app := range st.Apps {
		for _, w := range app.Workers {
			pids = append(pids, w.PID)
		}
	}
	a.Signal(syscall.SIGTERM)
	select {
	case <-a.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit within 30s of SIGTERM")
	}
	if a.ExitCode() != 0 {
		t.Errorf("agent exit code %d, want 0\n%s", a.ExitCode(), a.Log())
	}
	for _, p := range pids {
		if Alive(p) {
			t.Errorf("worker %d still running after the agent exited", p)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Errorf("port %d still accepts connections after the agent exited", port)
	}
	if _, err := os.Stat(sockPath); err == nil {
		t.Errorf("unix socket %s left behind", sockPath)
	}
	if _, err := os.Stat(a.Socket); err == nil {
		t.Errorf("control socket %s left behind", a.Socket)
	}
}

func TestStatusJSONShape(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, ""))
	a.WaitFor("2 ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	r := a.CLI("status", "--json")
	if r.Code != 0 {
		t.Fatalf("status --json: exit %d: %s", r.Code, r.Stderr)
	}
	var doc struct {
		Apps []struct {
			Name    string           `json:"name"`
			State   string           `json:"state"`
			Workers []map[string]any `json:"workers"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, r.Stdout)
	}
	if len(doc.Apps) != 1 || doc.Apps[0].Name != "web" || doc.Apps[0].State != "running" || len(doc.Apps[0].Workers) != 2 {
		t.Fatalf("unexpected status: %s", r.Stdout)
	}
	for _, key := range []string{"slot", "pid", "state", "release", "restarts", "uptime_seconds", "cpu_percent", "rss_bytes"} {
		if _, ok := doc.Apps[0].Workers[0][key]; !ok {
			t.Errorf("worker JSON lacks %q: %v", key, doc.Apps[0].Workers[0])
		}
	}
	if rss := doc.Apps[0].Workers[0]["rss_bytes"].(float64); rss <= 0 {
		t.Errorf("rss_bytes = %v, want > 0", rss)
	}
	text := a.CLI("status")
	for _, col := range []string{"APP", "SLOT", "PID", "STATE", "RELEASE", "UPTIME", "RESTARTS", "CPU", "RSS", "web"} {
		if !strings.Contains(text.Stdout, col) {
			t.Errorf("status table lacks %q:\n%s", col, text.Stdout)
		}
	}
}
