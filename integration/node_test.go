package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// Unmodified Node.js apps with real Express from npm (integration/nodeapps,
// installed by .ci/run or here): the tutorial's app verbatim, the common
// server.close handler, an ES module, npm start. Each is reloaded under a
// keep-alive and a new-connection-per-request load at once.

// tutorialApp is the Express "Hello world" example as its readers have it;
// only the port differs (a free one).
const tutorialApp = `const express = require('express')
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

// closeHandlerApp has the shutdown handler most PM2 users have.
const closeHandlerApp = `const express = require('express')
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

const server = app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})

process.on('SIGTERM', () => {
  console.log('SIGTERM received, closing server')
  server.close(() => process.exit(0))
})
`

// esmApp is the tutorial app as an ES module.
const esmApp = `import express from 'express'
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

// fastifyApp is Fastify's getting-started server (its default host, localhost).
const fastifyApp = `const fastify = require('fastify')()
const port = 3000

fastify.get('/', async () => 'Hello World!')

fastify.listen({ port }, (err) => {
  if (err) {
    console.error(err)
    process.exit(1)
  }
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

const koaApp = `const Koa = require('koa')
const app = new Koa()
const port = 3000

app.use((ctx) => {
  ctx.body = 'Hello World!'
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

const npmPackageJSON = `{
  "name": "hello",
  "private": true,
  "scripts": { "start": "node app.js" }
}
`

var (
	nodeOnce sync.Once
	nodeDir  string
	nodeErr  error
)

// nodeFixtures returns integration/nodeapps with its node_modules installed
// (npm ci). Without node or npm the test is skipped, except in CI
// (CI=true), where that is a failure.
func nodeFixtures(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed, and CI must run the Node.js tests: install Node.js 18+ (apt-get install nodejs npm)", tool)
			}
			t.Skipf("%s not installed: skipping the Node.js tests (install Node.js 18+ to run them)", tool)
		}
	}
	nodeOnce.Do(func() {
		nodeDir = filepath.Join(RepoRoot(), "integration", "nodeapps")
		for _, m := range []string{"express4", "express5", "fastify", "koa", "ws", "socket.io", "tsx", "ts-node", "typescript", "@types/node"} {
			if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", m, "package.json")); err != nil {
				cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", nodeDir)
				if out, err := cmd.CombinedOutput(); err != nil {
					nodeErr = fmt.Errorf("npm ci --prefix %s: %w\n%s", nodeDir, err, out)
				}
				return
			}
		}
	})
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	return nodeDir
}

// nodeApp writes files (with port 3000 replaced by port) into a new folder
// whose node_modules/express is the fixtures' express4 or express5 (module
// "express4" or "express5"), or node_modules/MODULE the fixtures' MODULE.
func nodeApp(t *testing.T, module string, port int, files map[string]string) string {
	t.Helper()
	fx := nodeFixtures(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := os.Mkdir(filepath.Join(dir, "node_modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := module
	if strings.HasPrefix(module, "express") {
		name = "express"
	}
	if err := os.Symlink(filepath.Join(fx, "node_modules", module), filepath.Join(dir, "node_modules", name)); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		body = strings.ReplaceAll(body, "3000", strconv.Itoa(port))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func nodeConfig(dir string, command []string, port, instances int, extra string) string {
	q := make([]string, len(command))
	for i, c := range command {
		q[i] = strconv.Quote(c)
	}
	return fmt.Sprintf(`[apps.web]
command = [%s]
cwd = %q
instances = %d
listen = ["tcp://127.0.0.1:%d"]
ready_timeout = "20s"
stop_timeout = "15s"
%s
`, strings.Join(q, ", "), dir, instances, port, extra)
}

// helloLoad is startLoad for apps that answer "Hello World!".
func helloLoad(t *testing.T, port, clients int, d time.Duration) (stop func() (loadgen.Result, loadgen.Result)) {
	t.Helper()
	check := func(status int, body []byte) error {
		if status != 200 || string(body) != "Hello World!" {
			return fmt.Errorf("status %d body %q", status, body)
		}
		return nil
	}
	holdLoadSlot(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	var ls []*loadgen.Load
	for _, ka := range []bool{true, false} {
		l, err := loadgen.Start(context.Background(), loadgen.Options{URL: url, Clients: clients, KeepAlive: ka,
			MaxRequests: 2_000_000, MaxDuration: d, Check: check})
		if err != nil {
			for _, l := range ls {
				l.Stop()
			}
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	t.Cleanup(func() { ls[0].Stop(); ls[1].Stop() })
	return func() (loadgen.Result, loadgen.Result) { return ls[0].Stop(), ls[1].Stop() }
}

// reloadNode runs the app of cfg, reloads it n times under load and checks:
// no failed request, every worker replaced by each reload, the app's own
// startup line once per worker start in its log.
func reloadNode(t *testing.T, cfg string, port, instances, n int) *Agent {
	return reloadNodeUnder(t, cfg, port, instances, n, func() func() (loadgen.Result, loadgen.Result) {
		return helloLoad(t, port, 20, 3*time.Minute)
	})
}

// reloadNodeUnder is reloadNode under the load that load starts (its stop
// returns the keep-alive and the new-connection results).
func reloadNodeUnder(t *testing.T, cfg string, port, instances, n int, load func() (stop func() (loadgen.Result, loadgen.Result))) *Agent {
	a := StartAgent(t, bins, cfg)
	st := a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := PIDs(appOf(st, "web"))
	stop := load()
	var took []time.Duration
	for i := 1; i <= n; i++ {
		t0 := time.Now()
		r := a.CLI("reload", "web")
		took = append(took, time.Since(t0))
		if r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s\n%s", i, r.Code, r.Stderr, a.Log())
		}
		st := a.Status()
		if !AllReady(st, "web", instances) {
			t.Fatalf("after reload %d: %+v", i, appOf(st, "web"))
		}
		after := PIDs(appOf(st, "web")) // slot -> pid
		old := map[int]bool{}
		for _, pid := range before {
			old[pid] = true
		}
		for slot, pid := range after {
			if old[pid] {
				t.Errorf("reload %d: worker %d (pid %d) was not replaced (before %v, after %v)", i, slot, pid, before, after)
			}
		}
		before = after
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	t.Logf("reload durations: %v", took)
	want := instances * (n + 1)
	line := fmt.Sprintf("Example app listening on port %d", port)
	a.WaitFor("app log lines", 10*time.Second, func(*api.Status) bool {
		b, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
		return strings.Count(string(b), line) >= want
	})
	b, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	if got := strings.Count(string(b), line); got != want {
		t.Errorf("the app's %q is in its log %d times, want %d (one per worker start):\n%s", line, got, want, b)
	}
	return a
}

func TestNodeTutorialAppExpress4(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": tutorialApp})
	reloadNode(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), port, 2, 5)
}

func TestNodeServerCloseHandlerExpress5(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": closeHandlerApp})
	reloadNode(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), port, 2, 5)
}

func TestNodeESModuleApp(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.mjs": esmApp})
	reloadNode(t, nodeConfig(dir, []string{"node", "app.mjs"}, port, 2, ""), port, 2, 5)
}

func TestNodeNpmStart(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": tutorialApp, "package.json": npmPackageJSON})
	reloadNode(t, nodeConfig(dir, []string{"npm", "start"}, port, 2, ""), port, 2, 5)
}

func TestNodeUnlistedPortIsAClearError(t *testing.T) {
	parallel(t)
	port, other := FreePort(t), FreePort(t)
	dir := nodeApp(t, "express5", other, map[string]string{"app.js": tutorialApp})
	a := StartAgent(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, 1, ""))
	want := fmt.Sprintf(`the app listens on port %d, which is not in the listen list of app "web"`, other)
	fix := fmt.Sprintf(`listen = ["tcp://0.0.0.0:%d"]`, other)
	st := a.WaitFor("the worker's error", 30*time.Second, func(st *api.Status) bool {
		app := appOf(st, "web")
		return app.LastExit != "" && strings.Contains(strings.Join(app.LastLines, "\n"), want)
	})
	app := appOf(st, "web")
	if !strings.Contains(app.LastExit, "exit status 1") {
		t.Errorf("the worker should exit 1, got %q", app.LastExit)
	}
	r := a.CLI("status", "web")
	t.Logf("deployd status web:\n%s", r.Stdout)
	for _, s := range []string{want, fix} {
		if !strings.Contains(r.Stdout+r.Stderr, s) {
			t.Errorf("deployd status web lacks %q:\n%s%s", s, r.Stdout, r.Stderr)
		}
	}
	// The app's own line must not claim it is listening on a port nobody serves.
	b, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	if strings.Contains(string(b), "Example app listening") {
		t.Errorf("the app printed its listening line although its listen failed:\n%s", b)
	}
}

func TestNodeReloadToAnUnlistedPortIsAbandoned(t *testing.T) {
	parallel(t)
	port, other := FreePort(t), FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": tutorialApp})
	a := StartAgent(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, 1, ""))
	st := a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	before := PIDs(appOf(st, "web"))
	app := strings.ReplaceAll(tutorialApp, "3000", strconv.Itoa(other))
	if err := os.WriteFile(filepath.Join(dir, "app.js"), []byte(app), 0o644); err != nil {
		t.Fatal(err)
	}
	r := a.CLI("reload", "web")
	if r.Code != 1 {
		t.Fatalf("reload to an unlisted port: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
	for _, want := range []string{"abandoned", fmt.Sprintf("the app listens on port %d", other),
		fmt.Sprintf(`listen = ["tcp://0.0.0.0:%d"]`, other), "previous version still serving"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("reload output lacks %q:\n%s", want, r.Stderr)
		}
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the old worker must keep serving: before %v, after %v", before, after)
	}
	if body, err := get(t, port, "/"); err != nil || body != "Hello World!" {
		t.Errorf("GET / after the abandoned reload: %q %v", body, err)
	}
}

func TestNodeFastifyApp(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "fastify", port, map[string]string{"app.js": fastifyApp})
	reloadNode(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), port, 2, 5)
}

func TestNodeKoaApp(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "koa", port, map[string]string{"app.js": koaApp})
	reloadNode(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), port, 2, 5)
}

// ready = "node-ipc" through npm start: npm's own node takes NODE_CHANNEL_FD,
// so the app's process.send('ready') goes through the preload's channel.
func TestNodeNpmStartWithNodeIPC(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	app := strings.Replace(tutorialApp, "console.log(`Example app listening on port ${port}`)",
		"console.log(`Example app listening on port ${port}`)\n  setTimeout(() => process.send('ready'), 1000)", 1)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": app, "package.json": npmPackageJSON})
	a := reloadNode(t, nodeConfig(dir, []string{"npm", "start"}, port, 2, `ready = "node-ipc"`), port, 2, 3)
	for _, w := range a.App("web").Workers {
		if w.ReadyMillis < 1000 {
			t.Errorf("worker %d ready after %d ms, before its process.send('ready') at 1 s", w.Slot, w.ReadyMillis)
		}
	}
}
