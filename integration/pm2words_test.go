package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// A PM2 7 user's first hour: a TypeScript app started as `pm2 start` would,
// PM2's words (all, a script's name, save, resurrect, flush, kill), a .env
// file, and an ecosystem file imported into the agent's own config.

// tsApp is the tutorial's Express app in TypeScript; it listens on PORT or
// 3000 (nodeApp writes the test's port for 3000).
const tsApp = `import express from 'express'
const app = express()
const port: number = Number(process.env.PORT) || 3000

app.get('/', (_req, res) => {
  res.send('Hello World!')
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

func TestStartTypeScriptAppWithProjectTsx(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"package.json": `{"type": "module"}`})
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := strings.ReplaceAll(tsApp, "3000", fmt.Sprint(port))
	if err := os.WriteFile(filepath.Join(dir, "src", "server.ts"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	// The project has tsx installed (npm install --save-dev tsx).
	if err := os.Symlink(filepath.Join(nodeFixtures(t), "node_modules", "tsx"), filepath.Join(dir, "node_modules", "tsx")); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()

	// No flag names the runner or the port: the project's tsx runs it, and
	// the agent learns the port from the app's own listen.
	r := a.CLIIn(dir, "start", "src/server.ts", "-i", "2")
	if r.Code != 0 {
		errLog, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "server.err.log"))
		t.Fatalf("deployd start src/server.ts -i 2: exit %d\n%s\napp's stderr:\n%s\nagent log:\n%s", r.Code, r.Stderr, errLog, a.Log())
	}
	if want := fmt.Sprintf("server serves tcp://0.0.0.0:%d", port); !strings.Contains(r.Stderr, want) {
		t.Errorf("the start message does not name the port the app listens on (%q):\n%s", want, r.Stderr)
	}
	cfg, _ := os.ReadFile(a.Config)
	if want := `command   = ["node", "--import", "tsx", "src/server.ts"]`; !strings.Contains(string(cfg), want) {
		t.Errorf("config lacks %s:\n%s", want, cfg)
	}
	st := a.WaitFor("2 ready workers", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "server", 2) })
	before := PIDs(appOf(st, "server"))
	stop := helloLoad(t, port, 10, 2*time.Minute)
	for i := 1; i <= 3; i++ {
		if r := a.CLIIn(dir, "reload", "server"); r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s\n%s", i, r.Code, r.Stderr, a.Log())
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	after := PIDs(appOf(a.Status(), "server"))
	for slot, pid := range after {
		if before[slot] == pid {
			t.Errorf("worker %d (pid %d) was not replaced by the reloads", slot, pid)
		}
	}
}

// A TypeScript file with no runner in the project, on a node without type
// stripping, is refused with the way to get one, and nothing is written.
func TestStartTypeScriptWithoutRunnerSaysHow(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "server.ts"), []byte(tsApp), 0o644); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	before, _ := os.ReadFile(a.Config)
	// No node on PATH: no type stripping either.
	r := cliWithEnv(t, dir, []string{"PATH=/nonexistent"}, "start", "server.ts", "-c", a.Config, "--socket", filepath.Join(dir, "none.sock"))
	if r.Code != 2 || !strings.Contains(r.Stderr, "npm install --save-dev tsx") {
		t.Errorf("start server.ts without a runner: exit %d, want 2 and the way to install tsx:\n%s", r.Code, r.Stderr)
	}
	if after, _ := os.ReadFile(a.Config); string(after) != string(before) {
		t.Errorf("a refused start changed the config:\n%s", after)
	}
}

// envApp answers with GREETING, which only its .env file sets.
const envApp = `const express = require('express')
const app = express()
app.get('/', (req, res) => res.send('greeting=' + (process.env.GREETING || '-')))
app.listen(process.env.PORT || 3000, () => console.log('up'))
`

func TestPM2WordsAndEnvFile(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": pm2App, "greet.js": envApp})
	envFile := filepath.Join(dir, ".env")
	if err := os.WriteFile(envFile, []byte("# secrets\nGREETING=\"hello from .env\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()
	mustRun(t, a.CLIIn(dir, "start", "app.js", "-i", "2", "--port", fmt.Sprint(port)), "start app.js")
	a.WaitFor("2 ready workers", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "app", 2) })

	// reload all: every app.
	r := a.CLIIn(dir, "reload", "all")
	mustRun(t, r, "reload all")
	// A script's name for its app.
	if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "Hello World!") {
		t.Fatalf("GET /: %q, %v", body, err)
	}
	r = a.CLIIn(dir, "logs", "app.js", "--out", "-n", "5")
	mustRun(t, r, "logs app.js")
	if !strings.Contains(r.Stdout, "request on stdout") {
		t.Errorf("logs app.js does not print the app's lines:\n%s", r.Stdout)
	}
	r = a.CLIIn(dir, "scale", "app.js", "+1")
	mustRun(t, r, "scale app.js +1")
	a.WaitFor("3 ready workers", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "app", 3) })
	r = a.CLIIn(dir, "show", "./app.js")
	mustRun(t, r, "show ./app.js")
	if !strings.Contains(r.Stdout, fmt.Sprintf("tcp://0.0.0.0:%d", port)) || strings.Contains(r.Stdout, "not in the config file") {
		t.Errorf("show ./app.js, run from the app's folder, does not show the agent's app:\n%s", r.Stdout)
	}
	for _, tc := range []struct{ cmd, want string }{
		{"save", "nothing to save: the apps are in " + a.Config},
		{"resurrect", "nothing to resurrect: the agent"},
		{"flush", "emptied"},
	} {
		r := a.CLIIn(dir, tc.cmd)
		if r.Code != 0 || !strings.Contains(r.Stdout+r.Stderr, tc.want) {
			t.Errorf("deployd %s: exit %d, want %q:\n%s%s", tc.cmd, r.Code, tc.want, r.Stdout, r.Stderr)
		}
	}

	// reload -c with another file than the agent's: refused, by name.
	other := filepath.Join(dir, "deployd.toml")
	if err := os.WriteFile(other, []byte("[apps.x]\ncommand = [\"true\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = a.CLIIn(dir, "reload", "-c", other, "--socket", a.Socket)
	if r.Code != 2 || !strings.Contains(r.Stderr, "runs "+a.Config+", not "+other) {
		t.Errorf("reload -c OTHER: exit %d, want 2 naming both files:\n%s", r.Code, r.Stderr)
	}
	r = cliWithEnv(t, dir, []string{"DEPLOYD_SOCKET=" + a.Socket}, "reload", "app")
	if r.Code != 0 || !strings.Contains(r.Stderr, "not ./deployd.toml") {
		t.Errorf("reload with a ./deployd.toml that is not the agent's: exit %d, want 0 and a note:\n%s", r.Code, r.Stderr)
	}
	os.Remove(other)

	// start --env-file: the app sees the file's variable.
	port2 := FreePort(t)
	r = a.CLIIn(dir, "start", "greet.js", "--env-file", ".env", "--port", fmt.Sprint(port2))
	mustRun(t, r, "start greet.js --env-file .env")
	a.WaitFor("greet ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "greet", 1) })
	if body, err := get(t, port2, "/"); err != nil || body != "greeting=hello from .env" {
		t.Errorf("GET / of the app started with --env-file: %q, %v", body, err)
	}

	// kill: as pm2 kill, the agent stops its apps and exits.
	mustRun(t, a.CLIIn(dir, "kill"), "kill")
	if _, err := get(t, port, "/"); err == nil {
		t.Errorf("the app still answers after deployd kill")
	}
}

func TestImportPM2ApplyStartsTheApps(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{
		"app.js": pm2App,
		"ecosystem.config.js": `module.exports = { apps: [{ name: 'eco', script: 'app.js', instances: 2, exec_mode: 'cluster',
  env: { PORT: 3000 } }] }`,
	})
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()
	r := a.CLIIn(dir, "import", "pm2", "ecosystem.config.js", "--apply", "--socket", a.Socket)
	mustRun(t, r, "import pm2 --apply")
	if !strings.Contains(r.Stderr, "added [apps.eco] to "+a.Config) {
		t.Errorf("import --apply does not say where it added the app:\n%s", r.Stderr)
	}
	r = a.CLIIn(dir, "ls", "--socket", a.Socket)
	mustRun(t, r, "ls")
	if !strings.Contains(r.Stdout, "eco") || strings.Count(r.Stdout, " ready ") != 2 {
		t.Errorf("ls after import --apply does not show eco's 2 workers ready:\n%s", r.Stdout)
	}
	if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "Hello World!") {
		t.Errorf("GET / of the imported app: %q, %v", body, err)
	}
	// Again: the app is there; nothing is written.
	before, _ := os.ReadFile(a.Config)
	r = a.CLIIn(dir, "import", "pm2", "ecosystem.config.js", "--apply", "--socket", a.Socket)
	if r.Code != 2 || !strings.Contains(r.Stderr, `app "eco" is already in`) {
		t.Errorf("second import --apply: exit %d:\n%s", r.Code, r.Stderr)
	}
	if after, _ := os.ReadFile(a.Config); string(after) != string(before) {
		t.Errorf("a refused import changed the config")
	}
}

// cliWithEnv runs the CLI in dir with only env (and HOME, TMPDIR), bounded
// by a minute: no DEPLOYD_CONFIG, unlike Agent.CLIIn.
func cliWithEnv(t *testing.T, dir string, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.Deployd, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}, env...)
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH"))
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("deployd %v did not end within a minute: %s%s", args, r.Stdout, r.Stderr)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run deployd %v: %v", args, err)
	}
	return r
}

// A script that fails at its first line is started as a PM2 user would:
// the failed start shows its last output, where the cause is, not only
// its exit status.
func TestStartOfAFailingScriptShowsItsOutput(t *testing.T) {
	parallel(t)
	nodeFixtures(t) // node is installed
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "crash.js"), []byte("require('./nosuch-module')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()
	r := a.CLIIn(dir, "start", "crash.js", "-i", "2")
	out := r.Stdout + r.Stderr
	for _, want := range []string{"exited before it was ready", "  new worker: exit status 1", "  its last output:", "Cannot find module './nosuch-module'"} {
		if r.Code != 1 || !strings.Contains(out, want) {
			t.Errorf("start crash.js: exit %d, want 1 and %q:\n%s", r.Code, want, out)
		}
	}
}
