package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/deployd/deployd/agent/api"
)

// healthApp is the test app ready by its health path, with extra keys.
func healthApp(port, instances int, ver, env, extra string) string {
	return versionedApp(port, instances, ver, env, "ready = \"http:/healthz\"\n"+extra)
}

// ready = "http:/healthz" under both loads at once: a release whose
// workers listen and send READY=1 at once, but whose health path says OK
// only 2 s later, is not counted ready before it does (the reload waits);
// one whose health path never says OK is abandoned with the old workers
// serving; no request fails.
func TestHTTPReadinessWaitsForHealthPath(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	const instances, okAfter = 2, 2 * time.Second
	a := StartAgent(t, bins, healthApp(port, instances, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	stop := startLoad(t, port, 20, 2*time.Minute)

	r, took := reloadTo(a, "web", healthApp(port, instances, "v2", fmt.Sprintf(`TESTAPP_HEALTH_AFTER = %q`, okAfter), ""))
	if r.Code != 0 {
		t.Fatalf("reload to v2: exit %d\n%s", r.Code, r.Stderr)
	}
	if took < okAfter {
		t.Errorf("the reload took %s: a worker counted ready before its health path said OK (after %s)", took, okAfter)
	}
	app := a.App("web")
	for _, w := range app.Workers {
		if w.Release == "" || w.ReadyMillis < okAfter.Milliseconds() {
			t.Errorf("worker %d (pid %d) ready after %d ms, want at least %d: READY=1 or the listen counted, not the health path",
				w.Slot, w.PID, w.ReadyMillis, okAfter.Milliseconds())
		}
	}
	for pid, v := range identities(t, port, PIDs(app)) {
		if v != "v2" {
			t.Errorf("after the reload, worker %d answers %s, want v2", pid, v)
		}
	}

	before := PIDs(a.App("web"))
	r, _ = reloadTo(a, "web", healthApp(port, instances, "v3", `TESTAPP_HEALTH_AFTER = "1h"`, `ready_timeout = "3s"`))
	if r.Code != 1 {
		t.Fatalf("reload to a release whose health path never says OK: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
	for _, want := range []string{"not ready within ready_timeout 3s", "last health check: GET /healthz: 503", "previous version still serving"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("reload output lacks %q:\n%s", want, r.Stderr)
		}
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("workers changed after the abandoned reload: %v, then %v", before, after)
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
}

// A worker whose health path hangs (it still serves everything else) fails
// its liveness check 3 times in a row and is replaced, new one ready
// first, under both loads at once with no failed request; the other
// worker is untouched. The failed checks are in the metrics.
func TestHungWorkerFailingLivenessIsReplaced(t *testing.T) {
	parallelUnderLoad(t)
	port, mport := FreePort(t), FreePort(t)
	const instances = 2
	// Timeouts well above the load's p99 (~0.5 s with the race-built agent):
	// only the hung worker fails.
	health := "[apps.web.health]\ninterval = \"500ms\"\ntimeout = \"500ms\"\nfailures = 3\n"
	a := StartAgent(t, bins, fmt.Sprintf("metrics = \"127.0.0.1:%d\"\n\n", mport)+healthApp(port, instances, "v1", "", health))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 20, 2*time.Minute)
	body, err := get(t, port, "/sick")
	if err != nil {
		t.Fatalf("GET /sick: %v", err)
	}
	var ver string
	var sick, slot int
	if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &sick, &slot); err != nil {
		t.Fatalf("GET /sick body %q: %v", body, err)
	}
	t0 := time.Now()
	st = a.WaitFor("the hung worker replaced", 30*time.Second, func(st *api.Status) bool {
		w := appOf(st, "web")
		ps := PIDs(w)
		return ps[slot] != 0 && ps[slot] != sick && !Alive(sick) && AllReady(st, "web", instances)
	})
	t.Logf("worker %d (pid %d) replaced %s after its health path hung", slot, sick, time.Since(t0).Round(time.Millisecond))
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)

	after := PIDs(appOf(st, "web"))
	for s, pid := range before {
		if s != slot && after[s] != pid {
			t.Errorf("the healthy worker %d changed: pid %d, then %d", s, pid, after[s])
		}
	}
	for _, w := range appOf(st, "web").Workers {
		want := 0
		if w.Slot == slot {
			want = 1
		}
		if w.HealthReplacements != want || w.HealthFailures != 0 {
			t.Errorf("worker %d: health_replacements %d, health_failures %d; want %d, 0", w.Slot, w.HealthReplacements, w.HealthFailures, want)
		}
	}
	mfs := scrape(t, mport)
	if mf := mfs["deployd_app_health_check_failures_total"]; mf.GetType() != dto.MetricType_COUNTER {
		t.Errorf("deployd_app_health_check_failures_total is a %v, want a counter", mf.GetType())
	}
	if v := mustSample(t, mfs, "deployd_app_health_check_failures_total", "app", "web"); v < 3 {
		t.Errorf("deployd_app_health_check_failures_total{app=\"web\"} = %v after the replacement, want at least the 3 failed checks", v)
	}
	if log := a.Log(); !strings.Contains(log, "failed its health check; replacing it") {
		t.Errorf("the agent log does not say why the worker was replaced:\n%s", log)
	}
	if out := a.CLI("status").Stdout; !strings.Contains(out, fmt.Sprintf("web[%d]: replaced 1 times for failing its health check", slot)) {
		t.Errorf("status does not show the health replacement:\n%s", out)
	}
}

// gunicorn serves every socket in LISTEN_FDS (it ignores --bind then), the
// health listener too: ready = "http:/healthz" gates its reloads, and its
// liveness checks pass.
func TestGunicornHTTPHealth(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install python3-gunicorn", debianPython, "-c", "import gunicorn")
	port := FreePort(t)
	app := func(ver, mode string) string {
		return fmt.Sprintf(`[apps.web]
command = [%q, "-m", "gunicorn", "--workers", "2", "--preload", "wsgi:app"]
cwd = %q
instances = 2
listen = ["tcp://127.0.0.1:%d"]
ready = "http:/healthz"
ready_timeout = "20s"
stop_timeout = "15s"
env = { APP_VERSION = %q, WSGI_APP_MODE = %q }
[apps.web.health]
interval = "1s"
timeout = "1s"
`, debianPython, appServersDir(), port, ver, mode)
	}
	a := StartAgent(t, bins, app("v1", ""))
	a.WaitFor("gunicorn ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	checkGated(t, a, port, app)
	requireHealthChecksPassed(t, a, "gunicorn")
}

// nodeHealthApp answers /healthz 503 for its first 1.5 s of listening, then
// 200; everything else "Hello World!".
const nodeHealthApp = `const http = require('http');
let since = 0;
const server = http.createServer((req, res) => {
  if (req.url === '/healthz') {
    res.statusCode = Date.now() - since < 1500 ? 503 : 200;
    return res.end(res.statusCode === 200 ? 'ok' : 'warming up');
  }
  res.end('Hello World!');
});
server.listen(3000, () => { since = Date.now(); });
`

// The Node.js integration serves the health listener with the app's own
// request handler: ready = "http:/healthz" waits for the app's 200 (not
// for the listen, which the preload reports at once), reloads under both
// loads lose nothing, and the liveness checks pass.
func TestNodeHTTPHealth(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": nodeHealthApp})
	cfg := nodeConfig(dir, []string{"node", "app.js"}, port, 2,
		"ready = \"http:/healthz\"\n[apps.web.health]\ninterval = \"2s\"\ntimeout = \"2s\"\n")
	a := StartAgent(t, bins, cfg)
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	for _, w := range appOf(st, "web").Workers {
		if w.ReadyMillis < 1500 {
			t.Errorf("node worker %d ready after %d ms, before its /healthz said 200 (1500 ms after listen)", w.Slot, w.ReadyMillis)
		}
	}
	stop := helloLoad(t, port, 20, 2*time.Minute)
	for i := 0; i < 2; i++ {
		if r := a.CLI("reload", "web"); r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s", i+1, r.Code, r.Stderr)
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	requireHealthChecksPassed(t, a, "node")
}

// The Go guide's example (worker.ServeHTTP, nothing else) answers the
// health checks on the health listener with its own handler.
func TestGoPackageServesHealth(t *testing.T) {
	parallel(t)
	path := goApp(t)
	port := FreePort(t)
	extra := "ready = \"http:/healthz\"\n[apps.web.health]\ninterval = \"1s\"\ntimeout = \"1s\"\n"
	a := StartAgent(t, bins, goAppConfig(path, port, 2, "v1", extra))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if r, _ := reloadTo(a, "web", goAppConfig(path, port, 2, "v2", extra)); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	requireHealthChecksPassed(t, a, "go")
	for _, w := range a.App("web").Workers {
		if w.Release == "" {
			t.Errorf("worker %d has no release", w.Slot)
		}
	}
}

// Puma with --bind-to-activated-sockets only serves every socket in
// LISTEN_FDS, the health listener (a unix socket) too.
func TestPumaHTTPHealth(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install puma", "ruby", "-e", `require "puma"`)
	port := FreePort(t)
	app := func(ver, mode string) string {
		return fmt.Sprintf(`[apps.web]
command = ["puma", "--bind-to-activated-sockets", "only", "-t", "4:4", "config.ru"]
cwd = %q
instances = 2
listen = ["tcp://127.0.0.1:%d"]
ready = "http:/healthz"
ready_timeout = "20s"
stop_timeout = "15s"
env = { APP_VERSION = %q, PUMA_APP_MODE = %q }
[apps.web.health]
interval = "1s"
timeout = "1s"
`, appServersDir(), port, ver, mode)
	}
	a := StartAgent(t, bins, app("v1", ""))
	a.WaitFor("puma ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	checkGated(t, a, port, app)
	requireHealthChecksPassed(t, a, "puma")
}

// gunicorn with uvicorn's worker class serves the health listener too.
func TestGunicornUvicornWorkerHTTPHealth(t *testing.T) {
	parallel(t)
	requireTool(t, "apt-get install python3-gunicorn python3-uvicorn", debianPython, "-c", "import gunicorn, uvicorn.workers")
	port := FreePort(t)
	app := func(ver string) string {
		return fmt.Sprintf(`[apps.web]
command = [%q, "-m", "gunicorn", "--workers", "1", "-k", "uvicorn.workers.UvicornWorker", "asgi:app"]
cwd = %q
instances = 2
listen = ["tcp://127.0.0.1:%d"]
ready = "http:/healthz"
ready_timeout = "20s"
stop_timeout = "15s"
env = { APP_VERSION = %q }
[apps.web.health]
interval = "1s"
timeout = "1s"
`, debianPython, appServersDir(), port, ver)
	}
	a := StartAgent(t, bins, app("v1"))
	a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if r, _ := reloadTo(a, "web", app("v2")); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	// The pid that answers is gunicorn's worker, a child of the one deployd runs.
	for i := 0; i < 20; i++ {
		if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "version=v2 ") {
			t.Fatalf("after the reload: %q, %v; want version=v2", body, err)
		}
	}
	requireHealthChecksPassed(t, a, "go")
}

// The agent that comes after an upgrade checks the workers it adopted: it
// finds each one's health socket, and replaces one whose health path hangs,
// under both loads with no failed request.
func TestAdoptedWorkersKeepTheirHealthChecks(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	// Timeouts well above the load's p99 (~0.5 s with the race-built agent):
	// only the hung worker fails.
	health := "[apps.web.health]\ninterval = \"500ms\"\ntimeout = \"500ms\"\nfailures = 3\n"
	a := NewAgentDir(t, bins, healthApp(port, 2, "v1", "", health))
	a.UseOwnBinary()
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, port, 20, 2*time.Minute)
	before := fmt.Sprint(workerPIDs(a.Status()))
	cand := filepath.Join(t.TempDir(), "deployd-new")
	CopyFile(t, bins.DeploydV2, cand)
	if r := a.CLI("upgrade", "--binary", cand); r.Code != 0 {
		t.Fatalf("upgrade: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if _, v := agentPID(t, a); v != "test-2" {
		t.Fatalf("after the upgrade the agent is %s, want test-2", v)
	}
	st := a.WaitFor("adopted workers ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if after := fmt.Sprint(workerPIDs(st)); after != before {
		t.Fatalf("workers %s after the upgrade, want the adopted %s", after, before)
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
	a.WaitFor("the adopted hung worker replaced", 30*time.Second, func(st *api.Status) bool {
		ps := PIDs(appOf(st, "web"))
		return ps[slot] != 0 && ps[slot] != sick && !Alive(sick) && AllReady(st, "web", 2)
	})
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
}

// config check says which fd an app's health listener is, and warns for a
// command that serves only fd 3 (exit 0: a warning changes nothing).
func TestConfigCheckTellsAboutHealthListener(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, healthApp(port, 2, "v1", "", "[apps.web.health]\nfailures = 2\n")+
		fmt.Sprintf(`[apps.api]
command = [%q, "-m", "uvicorn", "--fd", "3", "asgi:app"]
listen = ["tcp://127.0.0.1:%d"]
ready = "http:/healthz"
`, debianPython, FreePort(t)))
	r := a.CLI("config", "check", "-c", a.Config)
	if r.Code != 0 {
		t.Fatalf("config check: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{
		"health: GET /healthz every 5s, timeout 2s, replaced after 2 failures in a row",
		`note: health checks go to each worker's own listener, fd 4 (after the listen socket), named "deployd-health"`,
	} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("config check output lacks %q:\n%s", want, r.Stdout)
		}
	}
	if !strings.Contains(r.Stderr, `warning: `) || !strings.Contains(r.Stderr, `apps.api.ready = "http:/healthz": uvicorn --fd N serves only that fd`) ||
		strings.Contains(r.Stderr, "apps.web") {
		t.Errorf("config check should warn about apps.api only:\n%s", r.Stderr)
	}
}

// requireHealthChecksPassed checks that no worker of web (who: "gunicorn",
// "node", ... for the message) failed a health check or was replaced for it.
func requireHealthChecksPassed(t *testing.T, a *Agent, who string) {
	t.Helper()
	for _, w := range a.App("web").Workers {
		if w.HealthFailuresTotal != 0 || w.HealthReplacements != 0 {
			t.Errorf("%s worker %d: %d failed health checks (%q), %d replacements; want none",
				who, w.Slot, w.HealthFailuresTotal, w.HealthError, w.HealthReplacements)
		}
	}
}
