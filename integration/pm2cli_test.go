package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"
)

// PM2's muscle memory: `deployd start app.js -i 2`, delete, list, show,
// logs with both streams, per-environment env, and the scaled count that
// overrides instances, as a PM2 user meets them.

// pm2App answers with its NODE_ENV and MODE, and writes a line to stdout
// and one to stderr for each request (the app listens on PORT, which
// deployd start sets).
const pm2App = `const express = require('express')
const app = express()
const port = process.env.PORT || 3000

app.get('/', (req, res) => {
  console.log('request on stdout')
  console.error('request on stderr')
  res.send('Hello World! ' + (process.env.NODE_ENV || '-') + ' ' + (process.env.MODE || '-'))
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

// eventually polls cond (each call bounded by its own deadlines) until it
// holds or d passes.
func eventually(t *testing.T, a *Agent, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s\nagent log:\n%s", d, what, a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mustRun(t *testing.T, r Result, what string) {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", what, r.Code, r.Stdout, r.Stderr)
	}
}

// agentOnlyConfig is a config with an [agent] table and comments only.
const agentOnlyConfig = "# the agent of this host; apps are added by deployd start\n" +
	"pid_file = \"agent.pid\"   # read by the monitoring\n"

func TestPM2StartListShowLogsDelete(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": pm2App})
	a := NewAgentDir(t, bins, agentOnlyConfig)
	before, err := os.ReadFile(a.Config)
	if err != nil {
		t.Fatal(err)
	}
	a.Start()

	r := a.CLIIn(dir, "start", "app.js", "-i", "2", "--port", fmt.Sprint(port))
	mustRun(t, r, "deployd start app.js -i 2")
	st := a.Status()
	if !AllReady(st, "app", 2) {
		t.Fatalf("after deployd start: want 2 ready workers of app, got %+v\n%s", st.Apps, r.Stderr)
	}
	pids := PIDs(appOf(st, "app"))
	if body, err := get(t, port, "/"); err != nil || body != "Hello World! - -" {
		t.Fatalf("GET /: %q, %v", body, err)
	}
	after, _ := os.ReadFile(a.Config)
	if !bytes.HasPrefix(after, before) || !bytes.Contains(after, []byte("[apps.app]")) {
		t.Fatalf("the config's own text was not kept, or no [apps.app] was added:\n%s", after)
	}
	if r := a.CLIIn(dir, "config", "check"); r.Code != 0 || !strings.Contains(r.Stdout, "app app: 2 workers of") {
		t.Errorf("config check after start: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = a.CLIIn(dir, "start", "app.js", "-i", "2", "--port", fmt.Sprint(port))
	if r.Code != 2 || !strings.Contains(r.Stderr, `app "app" is already in`) {
		t.Errorf("second start of the same name: exit %d, %s", r.Code, r.Stderr)
	}
	if b, _ := os.ReadFile(a.Config); !bytes.Equal(b, after) {
		t.Errorf("a refused start changed the config:\n%s", b)
	}

	for _, cmd := range []string{"list", "ls"} {
		r := a.CLIIn(dir, cmd)
		mustRun(t, r, cmd)
		for _, pid := range pids {
			if !strings.Contains(r.Stdout, fmt.Sprint(pid)) || strings.Count(r.Stdout, " ready ") != 2 {
				t.Errorf("deployd %s does not list worker %d ready:\n%s", cmd, pid, r.Stdout)
			}
		}
	}
	r = a.CLIIn(dir, "show", "app")
	mustRun(t, r, "show app")
	for _, want := range []string{"node app.js", fmt.Sprintf("tcp://0.0.0.0:%d", port), "variables    PORT",
		filepath.Join(a.Dir, "logs", "app.out.log"), filepath.Join(a.Dir, "logs", "app.err.log"), "state running"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("show app lacks %q:\n%s", want, r.Stdout)
		}
	}
	for _, pid := range pids {
		if !strings.Contains(r.Stdout, fmt.Sprint(pid)) {
			t.Errorf("show app lacks worker %d:\n%s", pid, r.Stdout)
		}
	}

	checkMonit(t, a, pids)

	// Both streams, each line marked; --err alone, unmarked.
	var logs Result
	eventually(t, a, "both streams in deployd logs", 20*time.Second, func() bool {
		logs = a.CLIIn(dir, "logs", "app")
		return strings.Contains(logs.Stdout, "out | ") && strings.Contains(logs.Stdout, "err | ")
	})
	for _, want := range []string{"request on stdout", "request on stderr"} {
		if !strings.Contains(logs.Stdout, want) {
			t.Errorf("deployd logs lacks %q:\n%s", want, logs.Stdout)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(logs.Stdout), "\n") {
		if strings.Contains(l, "request on stderr") && !strings.HasPrefix(l, "err | ") ||
			strings.Contains(l, "request on stdout") && !strings.HasPrefix(l, "out | ") {
			t.Errorf("line marked with the wrong stream: %q", l)
		}
	}
	r = a.CLIIn(dir, "logs", "app", "--err")
	mustRun(t, r, "logs --err")
	if !strings.Contains(r.Stdout, "request on stderr") || strings.Contains(r.Stdout, "request on stdout") || strings.Contains(r.Stdout, "err | ") {
		t.Errorf("logs --err is not the stderr log alone, unmarked:\n%s", r.Stdout)
	}

	r = a.CLIIn(dir, "delete", "app")
	mustRun(t, r, "delete app")
	if b, _ := os.ReadFile(a.Config); !bytes.Equal(b, before) {
		t.Errorf("after delete the config is not what it was before start:\n%s\nwant:\n%s", b, before)
	}
	if st := a.Status(); len(st.Apps) != 0 {
		t.Errorf("after delete the agent still runs %+v", st.Apps)
	}
	eventually(t, a, "the deleted app's workers to exit", 30*time.Second, func() bool {
		for _, pid := range pids {
			if Alive(pid) {
				return false
			}
		}
		return true
	})
	if _, err := get(t, port, "/"); err == nil {
		t.Errorf("port %d still answers after delete", port)
	}
}

func TestPM2StartEnvSelectsEnvTable(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"server.js": pm2App})
	a := StartAgent(t, bins, agentOnlyConfig)

	r := a.CLIIn(dir, "start", "server.js", "--name", "api", "--port", fmt.Sprint(port), "--env", "production")
	mustRun(t, r, "deployd start --env production")
	if body, err := get(t, port, "/"); err != nil || body != "Hello World! production -" {
		t.Fatalf("GET / after start --env production: %q, %v", body, err)
	}
	// A second environment, added by hand, selected by reload --env.
	f, err := os.OpenFile(a.Config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "\n# staging: the test database\n[apps.api.env_staging]\nNODE_ENV = \"staging\"\nMODE = \"test-db\"\n")
	f.Close()
	r = a.CLIIn(dir, "reload", "api", "--env", "staging")
	mustRun(t, r, "deployd reload api --env staging")
	if body, err := get(t, port, "/"); err != nil || body != "Hello World! staging test-db" {
		t.Fatalf("GET / after reload --env staging: %q, %v", body, err)
	}
	b, _ := os.ReadFile(a.Config)
	if !strings.Contains(string(b), "environment = \"staging\"\n") || !strings.Contains(string(b), "# staging: the test database\n") {
		t.Errorf("the config does not record the choice, or lost a comment:\n%s", b)
	}
	r = a.CLIIn(dir, "reload", "api", "--env", "qa")
	if r.Code != 2 || !strings.Contains(r.Stderr, "no [apps.api.env_qa] table") {
		t.Errorf("reload --env of a missing table: exit %d, %s", r.Code, r.Stderr)
	}
}

func TestPM2ScaledCountIsNamed(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 1, ""))
	eventually(t, a, "1 ready worker", 30*time.Second, func() bool { return AllReady(a.Status(), "web", 1) })
	mustRun(t, a.CLIIn(a.Dir, "scale", "web", "2"), "scale web 2")
	a.WriteConfig(appConfig("web", port, 3, ""))

	const note = "2 workers as scaled by `deployd scale` (config says 3); run `deployd scale web 3` or `deployd scale web --reset`"
	r := a.CLIIn(a.Dir, "reload", "web")
	mustRun(t, r, "reload web")
	if !strings.Contains(r.Stderr, note) {
		t.Errorf("reload does not say the scaled count overrides instances:\n%s", r.Stderr)
	}
	r = a.CLIIn(a.Dir, "config", "check")
	mustRun(t, r, "config check")
	if !strings.Contains(r.Stdout, "note: web: "+note) {
		t.Errorf("config check does not say the scaled count overrides instances:\n%s", r.Stdout)
	}
	if !AllReady(a.Status(), "web", 2) {
		t.Fatalf("the reload did not keep the scaled count: %+v", a.Status().Apps)
	}

	mustRun(t, a.CLIIn(a.Dir, "scale", "web", "--reset"), "scale web --reset")
	if st := a.Status(); !AllReady(st, "web", 3) || appOf(st, "web").Scaled != 0 {
		t.Fatalf("after scale --reset: %+v", appOf(st, "web"))
	}
	r = a.CLIIn(a.Dir, "config", "check")
	if r.Code != 0 || strings.Contains(r.Stdout, "scaled") {
		t.Errorf("config check after --reset: exit %d\n%s", r.Code, r.Stdout)
	}
	r = a.CLIIn(a.Dir, "reload", "web")
	if r.Code != 0 || strings.Contains(r.Stderr, "scaled") {
		t.Errorf("reload after --reset: exit %d\n%s", r.Code, r.Stderr)
	}
}

// checkMonit runs `deployd monit --interval 100ms` until it has redrawn the
// table with the workers twice, then ends it with Ctrl-C (exit 0).
func checkMonit(t *testing.T, a *Agent, pids map[int]int) {
	t.Helper()
	cmd := exec.Command(bins.Deployd, "monit", "--interval", "100ms")
	cmd.Dir = a.Dir
	cmd.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	eventually(t, a, "two refreshes of deployd monit", 20*time.Second, func() bool {
		s := out.String()
		for _, pid := range pids {
			if strings.Count(s, fmt.Sprint(pid)) < 2 || !strings.Contains(s, "\n--- ") || !strings.Contains(s, "CPU") {
				return false
			}
		}
		return true
	})
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		exited <- err // for the deferred wait
		if err != nil {
			t.Errorf("deployd monit after Ctrl-C: %v, want exit 0\n%s", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Errorf("deployd monit still runs 10s after Ctrl-C")
	}
}
