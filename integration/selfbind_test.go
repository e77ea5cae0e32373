package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// selfBindBin is integration/selfbind (a Go server that binds its own
// port and calls Shutdown on SIGTERM), built once per run.
var selfBindBin = sync.OnceValues(func() (string, error) {
	return Build(bins.Dir, "selfbind", "./integration/selfbind", "")
})

// selfBindJava is integration/appservers/SelfBind.java (a JDK HttpServer
// on $PORT with a shutdown hook), compiled once per run into a folder
// every user can read.
var selfBindJava = sync.OnceValues(func() (string, error) {
	dir := filepath.Join(bins.Dir, "java")
	out, err := exec.Command("javac", "-d", dir, filepath.Join(appServersDir(), "SelfBind.java")).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("javac: %v\n%s", err, out)
	}
	return dir, os.Chmod(dir, 0o755)
})

// selfBinder is a server as its users write it, binding its own port.
type selfBinder struct {
	name string
	argv func(t *testing.T, port int) []string
	env  string // more of the app's env, e.g. `, DENO_DIR = "/tmp/x"`
}

var selfBinders = []selfBinder{
	{"go", func(t *testing.T, _ int) []string {
		bin, err := selfBindBin()
		if err != nil {
			t.Fatal(err)
		}
		return []string{bin}
	}, ""},
	{"jdk", func(t *testing.T, _ int) []string {
		requireTool(t, "apt-get install openjdk-17-jdk-headless", "javac", "-version")
		dir, err := selfBindJava()
		if err != nil {
			t.Fatal(err)
		}
		return []string{"/usr/bin/java", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", dir, "SelfBind"}
	}, ""},
	{"uvicorn", func(t *testing.T, port int) []string {
		requireTool(t, "apt-get install python3-uvicorn", debianPython, "-c", "import uvicorn")
		return []string{debianPython, "-m", "uvicorn", "--app-dir", appServersDir(), "--port", strconv.Itoa(port), "asgi:app"}
	}, ""},
	{"bun", func(t *testing.T, _ int) []string {
		return []string{npmTool(t, "bun"), filepath.Join(selfBindAppsDir(), "bun_server.js")}
	}, ""},
	{"deno", func(t *testing.T, _ int) []string {
		return []string{npmTool(t, "deno"), "run", "--allow-net", "--allow-env", filepath.Join(selfBindAppsDir(), "deno_server.js")}
	}, `, DENO_DIR = "/tmp/deployd-it-deno", NO_COLOR = "1"`},
}

// selfBindAppsDir holds the Bun and Deno servers and the npm project that
// installs both (npm ci in .ci/run).
func selfBindAppsDir() string { return filepath.Join(RepoRoot(), "integration", "selfbindapps") }

// npmTool is the binary name the npm project installed, or skips the test.
func npmTool(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(selfBindAppsDir(), "node_modules", ".bin", name)
	requireTool(t, "npm ci --prefix integration/selfbindapps", p, "--version")
	return p
}

// selfBindApp is the config a user writes for such a server: command,
// instances, listen and PORT; nothing about how it gets its socket.
func selfBindApp(argv []string, port, instances int, ver, env string) string {
	return selfBindAppWith(argv, port, instances, ver, env, "")
}

// selfBindAppWith is selfBindApp with more lines of the app's table.
func selfBindAppWith(argv []string, port, instances int, ver, env, more string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf(`[apps.web]
command = [%s]
instances = %d
listen = ["tcp://127.0.0.1:%d"]
user = "nobody"
stop_timeout = "15s"
ready_timeout = "60s"
%s
env = { PORT = "%d", APP_VERSION = %q%s }
`, strings.Join(q, ", "), instances, port, more, port, ver, env)
}

// Two workers of each unmodified self-binding server (run as nobody) serve
// one port, each on a socket of its own that its bind took (the default
// balance, "auto", steers once a worker binds the address itself), and
// each new release binds while the old one serves: over 5 reloads under a
// keep-alive and a new-connection load at once no connection is refused
// and no new-connection request fails, since a reload takes each old
// worker out of the rotation and lets what it accepted run dry before its
// stop signal (the quiet phase). Then an agent upgrade and an agent
// SIGKILL keep the same pids with no failed request at all, and the agent
// after the SIGKILL answers the binds of a reload's new workers.
//
// The keep-alive failures left are the server's own: all of them close
// idle kept-alive connections under their client (Go's client then
// retries, counted), and Go's Shutdown, the JDK's HttpServer.stop,
// uvicorn and Deno close one between two requests. They are counted and
// logged, not failed (docs/compatibility.md lists them per runtime). With
// the shared socket (balance = "shared") the same servers lost new
// connections too: Go 9-26, uvicorn 21, Deno 25 per 5 reloads.
func TestSelfBindingServersReloadUpgradeAndAgentKill(t *testing.T) {
	for _, sb := range selfBinders {
		t.Run(sb.name, func(t *testing.T) {
			parallelUnderLoad(t)
			checkSelfBinder(t, sb)
		})
	}
}

// startSelfBinder starts an agent with instances workers of sb on a free
// port, ready; app is its config for a version, with more lines of the
// app's table.
func startSelfBinder(t *testing.T, sb selfBinder, instances int, more string) (a *Agent, port int, app func(ver string) string, st *api.Status) {
	port = FreePort(t)
	argv := sb.argv(t, port)
	app = func(ver string) string { return selfBindAppWith(argv, port, instances, ver, sb.env, more) }
	a = NewAgentDir(t, bins, app("v1"))
	a.UseOwnBinary()
	a.Start()
	st = a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	return a, port, app, st
}

func checkSelfBinder(t *testing.T, sb selfBinder) {
	const instances, reloads = 2, 5
	more := "" // the default balance; DEPLOYD_TEST_SELFBIND_BALANCE=shared shows what it saves
	if b := os.Getenv("DEPLOYD_TEST_SELFBIND_BALANCE"); b != "" {
		more = fmt.Sprintf("balance = %q", b)
	}
	a, port, app, st := startSelfBinder(t, sb, instances, more)
	for _, w := range appOf(st, "web").Workers {
		if !strings.HasPrefix(w.Socket, "answered bind (") || !strings.HasSuffix(w.Socket, "; a socket of its own)") {
			t.Errorf("worker %d: socket %q, want its bind answered with a socket of its own\n%s", w.PID, w.Socket, a.Log())
		}
	}
	if b := appOf(st, "web").Balance; b != "even" {
		t.Errorf("balance %q once the workers bound the address, want even", b)
	}
	for pid, v := range identities(t, port, PIDs(appOf(st, "web"))) {
		if v != "v1" {
			t.Fatalf("worker %d answers %s, want v1", pid, v)
		}
	}
	_, nka := reloadsUnderLoad(t, a, port, app, 2, reloads)
	requireNoFailures(t, "new-connection clients over 5 reloads", nka)

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

	reloadsUnderLoad(t, a, port, app, 9, 1)
}

// reloadsUnderLoad reloads web n times (versions from vFirst) under both
// loads: no connection refused (the port always had a listener), every
// worker on the new version after each. The server's own shutdown's
// failures are logged: Go's and the JDK's close connections they accepted
// and did not answer (a reset, or EOF), and idle kept-alive ones.
func reloadsUnderLoad(t *testing.T, a *Agent, port int, app func(ver string) string, first, n int) (ka, nka loadgen.Result) {
	t.Helper()
	stop := startLoad(t, port, 20, 3*time.Minute)
	for i := range n {
		ver := fmt.Sprintf("v%d", first+i)
		r, took := reloadTo(a, "web", app(ver))
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
	ka, nka = stop()
	for _, r := range []struct {
		what string
		res  loadgen.Result
	}{{"keep-alive", ka}, {"new-connection", nka}} {
		t.Logf("%d reloads, %s clients: %s; failures (the server's own shutdown): %v", n, r.what, r.res, r.res.Errors)
		if r.res.Requests == 0 || r.res.Refused != 0 {
			t.Errorf("%d reloads, %s clients: %s: want requests and no connection refused", n, r.what, r.res)
		}
	}
	return ka, nka
}

// A self-binding worker's bind is answered by whichever agent runs: the
// one an upgrade started (the notify fd crossed with the worker), and,
// for a bind made while no agent runs, the one started after an agent
// SIGKILL (it copies the notify fd the worker keeps): the bind waits
// meanwhile, it does not fail with ENOSYS.
func TestSelfBindAcrossUpgradeAndAgentKill(t *testing.T) {
	parallel(t)
	const instances = 2
	port := FreePort(t)
	a := NewAgentDir(t, bins, selfBindApp(selfBinders[0].argv(t, port), port, instances, "v1", ""))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	pids := PIDs(appOf(st, "web"))

	upgradeBy(t, a, "cli")
	st = a.WaitFor("ready after the upgrade", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	wantSocket(t, a, st, pids[1], "answered bind (before this agent; a socket of its own)")
	rebind(t, a, pids[0])
	wantSocket(t, a, a.Status(), pids[0], "answered bind (1 of 1 binds took the agent's socket; a socket of its own)")

	pid, _ := agentPID(t, a)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid, 10*time.Second)
	if err := syscall.Kill(pids[1], syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !inBind(pids[1]); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("worker %d is not waiting in bind 10 s after SIGHUP with no agent\n%s", pids[1], outLog(t, a))
		}
	}
	a.Start()
	a.WaitFor("ready under the next agent", 60*time.Second, func(st *api.Status) bool {
		return st.Agent.PID != pid && AllReady(st, "web", instances)
	})
	waitRebound(t, a, pids[1])
	// After a SIGKILL the steering program cannot be taken over: the next
	// agent serves on a survivor's socket, shared, and says so.
	wantSocket(t, a, a.Status(), pids[1], "answered bind (1 of 1 binds took the agent's socket; the shared socket)")
}

// wantSocket checks what status says of how worker pid got its socket.
func wantSocket(t *testing.T, a *Agent, st *api.Status, pid int, want string) {
	t.Helper()
	for _, w := range appOf(st, "web").Workers {
		if w.PID == pid && w.Socket != want {
			t.Errorf("worker %d: socket %q, want %q\n%s", pid, w.Socket, want, a.Log())
		}
	}
}

// rebind makes worker pid bind its port once more and waits for the answer.
func rebind(t *testing.T, a *Agent, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitRebound(t, a, pid)
}

// waitRebound waits for worker pid's "rebound" line in the app's log.
func waitRebound(t *testing.T, a *Agent, pid int) {
	t.Helper()
	ok, bad := fmt.Sprintf("rebound ok %d", pid), fmt.Sprintf("rebound err %d", pid)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out := outLog(t, a)
		switch {
		case strings.Contains(out, bad):
			t.Fatalf("worker %d's bind failed:\n%s", pid, out)
		case strings.Contains(out, ok):
			return
		case time.Now().After(deadline):
			t.Fatalf("worker %d's bind not answered within 20 s:\n%s\n%s", pid, out, a.Log())
		}
	}
}

// outLog is the app's stdout log so far.
func outLog(t *testing.T, a *Agent) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// inBind reports whether a thread of pid is in bind(2), as the kernel
// says (/proc/PID/task/TID/syscall starts with the call's number).
func inBind(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	for _, f := range tasks {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), strconv.Itoa(unix.SYS_BIND)+" ") {
			return true
		}
	}
	return false
}
