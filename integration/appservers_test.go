package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// appServersDir holds the apps written for real app servers (Rack, WSGI,
// a bare socket).
func appServersDir() string { return filepath.Join(RepoRoot(), "integration", "appservers") }

// debianPython is Debian's python3, which sees python3-gunicorn and
// python3-sdnotify (a pyenv python3 first in PATH does not).
const debianPython = "/usr/bin/python3"

// requireTool skips the test, with a line saying how to install it, when
// argv does not run successfully.
func requireTool(t *testing.T, install string, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Skipf("skipped: %v: %v %s; install it with `%s` (.ci/run does)", argv, err, strings.TrimSpace(string(out)), install)
	}
}

// serverApp is an [apps.NAME] table running argv from the appservers folder.
func serverApp(name string, port, instances int, argv []string, env, extra string) string {
	return serverAppReady(name, "notify", port, instances, argv, env, extra)
}

// serverAppReady is serverApp with another ready mode.
func serverAppReady(name, ready string, port, instances int, argv []string, env, extra string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf(`[apps.%s]
command = [%s]
cwd = %q
instances = %d
listen = ["tcp://127.0.0.1:%d"]
ready = %q
ready_timeout = "20s"
stop_timeout = "15s"
env = { %s }
%s
`, name, strings.Join(q, ", "), appServersDir(), instances, port, ready, env, extra)
}

// reloadTo rewrites the config with body, reloads app and returns the
// result and how long it took.
func reloadTo(a *Agent, app, body string) (Result, time.Duration) {
	a.WriteConfig(body)
	t0 := time.Now()
	r := a.CLI("reload", app)
	return r, time.Since(t0)
}

// checkGated runs the readiness gate on a real server: a release that
// takes 2 s to boot makes the reload wait for its READY=1, and one that
// fails at boot is abandoned while the previous one serves.
func checkGated(t *testing.T, a *Agent, port int, app func(ver, mode string) string) {
	t.Helper()
	r, took := reloadTo(a, "web", app("v2", "slow"))
	if r.Code != 0 {
		t.Fatalf("reload to a slow-booting v2: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	if took < 2*time.Second {
		t.Errorf("reload to a release that boots 2 s late took %s: not gated on READY=1", took)
	}
	for pid, v := range identities(t, port, PIDs(a.App("web"))) {
		if v != "v2" {
			t.Errorf("after the reload, worker %d answers %s, want v2", pid, v)
		}
	}
	before := PIDs(a.App("web"))
	r, _ = reloadTo(a, "web", app("v3", "broken"))
	if r.Code != 1 || !strings.Contains(r.Stderr, "previous version still serving") {
		t.Errorf("reload to a release that fails at boot: exit %d, want 1 with the previous version serving\n%s", r.Code, r.Stderr)
	}
	after := PIDs(a.App("web"))
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("workers changed after an abandoned reload: %v, then %v", before, after)
	}
	for _, v := range identities(t, port, after) {
		if v != "v2" {
			t.Errorf("after the abandoned reload a worker answers %s, want v2", v)
		}
	}
}

// Puma's systemd plugin (sd_notify gem) needs NOTIFY_SOCKET to be a path;
// with it Puma starts, reports READY=1, reloads and is ready-gated.
func TestPumaReadyNotify(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install puma ruby-sd-notify", "ruby", "-e", `require "sd_notify"; require "puma"`)
	port := FreePort(t)
	app := func(ver, mode string) string {
		return serverApp("web", port, 2, []string{"puma", "--bind-to-activated-sockets", "only", "-t", "4:4", "config.ru"},
			fmt.Sprintf("APP_VERSION = %q, PUMA_APP_MODE = %q", ver, mode), "")
	}
	a := StartAgent(t, bins, app("v1", ""))
	a.WaitFor("puma ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if !strings.Contains(a.CLI("logs", "web", "-n", "100").Stdout, "Enabling systemd notification integration") {
		t.Errorf("Puma did not load its systemd plugin:\n%s", a.CLI("logs", "web", "-n", "100").Stdout)
	}
	checkGated(t, a, port, app)
}

// gunicorn sends READY=1 itself (after importing the app, with --preload).
func TestGunicornReadyNotify(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install python3-gunicorn", debianPython, "-c", "import gunicorn")
	port := FreePort(t)
	app := func(ver, mode string) string {
		return serverApp("web", port, 2, []string{debianPython, "-m", "gunicorn", "--workers", "2", "--preload", "wsgi:app"},
			fmt.Sprintf("APP_VERSION = %q, WSGI_APP_MODE = %q", ver, mode), "")
	}
	a := StartAgent(t, bins, app("v1", ""))
	a.WaitFor("gunicorn ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	checkGated(t, a, port, app)
}

// notifyLine is what integration/appservers/sockapp.py prints about its
// NOTIFY_SOCKET.
var notifyLine = regexp.MustCompile(`notify=(\S+) mode=(\d+) uid=(\d+)`)

// A Python sd_notify client (the sdnotify package) gets ready on the path
// socket, which is private (0600) and removed once the worker is gone;
// and the connections the worker accepts have TCP_NODELAY, or not with
// tcp_nodelay = false.
func TestNotifyPathAndTCPNoDelay(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install python3-sdnotify", debianPython, "-c", "import sdnotify")
	port := FreePort(t)
	app := func(extra string) string {
		return serverApp("web", port, 1, []string{debianPython, "sockapp.py"}, `APP = "py"`, extra)
	}
	a := StartAgent(t, bins, app(""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	logs := a.CLI("logs", "web", "-n", "50").Stdout
	m := notifyLine.FindStringSubmatch(logs)
	if m == nil || !strings.Contains(logs, "ready via sdnotify") {
		t.Fatalf("the worker saw no path NOTIFY_SOCKET, or did not notify through sdnotify:\n%s", logs)
	}
	notifyDir := filepath.Join(a.Dir, "state", "run", "notify")
	if !strings.HasPrefix(m[1], notifyDir+"/") || m[2] != "600" || m[3] != fmt.Sprint(os.Getuid()) {
		t.Errorf("NOTIFY_SOCKET %s mode %s uid %s; want a path under %s, mode 600, the worker's uid %d",
			m[1], m[2], m[3], notifyDir, os.Getuid())
	}
	if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "nodelay=1") {
		t.Errorf("GET / = %q, %v; want nodelay=1 (TCP_NODELAY inherited from the listener)", body, err)
	}
	r, _ := reloadTo(a, "web", app("tcp_nodelay = false"))
	if r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "nodelay=0") {
		t.Errorf("with tcp_nodelay = false, GET / = %q, %v; want nodelay=0", body, err)
	}
	// The old worker drains in the background after the reload returned;
	// its notify socket goes when it has exited.
	deadline := time.Now().Add(15 * time.Second)
	_, err := os.Stat(m[1])
	for ; !os.IsNotExist(err) && time.Now().Before(deadline); _, err = os.Stat(m[1]) {
		time.Sleep(20 * time.Millisecond)
	}
	if !os.IsNotExist(err) {
		t.Errorf("the replaced worker's notify socket %s is still there 15 s after the reload (%v)", m[1], err)
	}
	if r := a.CLI("stop", "web"); r.Code != 0 {
		t.Fatalf("stop: exit %d\n%s", r.Code, r.Stderr)
	}
	if ents, err := os.ReadDir(notifyDir); err != nil || len(ents) != 0 {
		t.Errorf("after stop, %s holds %v (%v); want nothing", notifyDir, ents, err)
	}
}
