package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// listenPIDApp answers what the socket-activation variables say in the app
// and in a child it ran before listening (the child inherits NODE_OPTIONS
// and DEPLOYD_NODE, so the preload runs in it too).
const listenPIDApp = `const http = require('http');
const { execFileSync } = require('child_process');
const child = execFileSync(process.execPath, ['-e',
  'process.stdout.write(process.env.LISTEN_PID + " " + process.pid)']).toString().split(' ');
http.createServer((req, res) => {
  res.end('listen_pid=' + process.env.LISTEN_PID + ' pid=' + process.pid + ' fds=' + process.env.LISTEN_FDS +
    ' child_listen_pid=' + child[0] + ' child_pid=' + child[1]);
}).listen(Number(process.env.PORT));
`

// TestNodeWorkerHasItsOwnListenPID: a node command the agent runs directly
// (no exec shim in between: the preload sets LISTEN_PID) gives the app
// LISTEN_PID = its own pid, as does a pinned one (through the shim); a child
// of the app sees its parent's pid, not its own, so it leaves the listeners
// alone — the systemd rule gunicorn, sd_listen_fds and node libraries check.
func TestNodeWorkerHasItsOwnListenPID(t *testing.T) {
	parallel(t)
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not installed, and CI must run the Node.js tests: install Node.js 18+")
		}
		t.Skip("node not installed")
	}
	for _, c := range []struct {
		name   string
		argv   []string
		extra  string
		direct bool
	}{
		{"node from PATH", []string{"node", "app.js"}, "", true},
		{"absolute node path", []string{node, "app.js"}, "", true},
		{"pinned (through the shim)", []string{"node", "app.js"}, "cpu_affinity = true", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // see parallel.go
			dir := t.TempDir()
			os.Chmod(dir, 0o755)
			if err := os.WriteFile(filepath.Join(dir, "app.js"), []byte(listenPIDApp), 0o644); err != nil {
				t.Fatal(err)
			}
			port := FreePort(t)
			a := StartAgent(t, bins, nodeConfig(dir, c.argv, port, 1, c.extra))
			st := a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
			pid := PIDs(appOf(st, "web"))[0]
			body, err := get(t, port, "/")
			if err != nil {
				t.Fatalf("GET /: %v\n%s", err, a.Log())
			}
			want := fmt.Sprintf("listen_pid=%d pid=%d fds=1 child_listen_pid=%d child_pid=", pid, pid, pid)
			if !strings.HasPrefix(body, want) {
				t.Fatalf("the app says %q, want %q...", body, want)
			}
			if strings.TrimPrefix(body, want) == fmt.Sprint(pid) {
				t.Fatalf("the child has the app's pid? %q", body)
			}
			// The environment node was started with: the shim puts LISTEN_PID
			// in it; a direct start leaves it to the preload (one Go runtime
			// start less per worker).
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err != nil {
				t.Fatal(err)
			}
			shimmed := strings.Contains("\x00"+string(env), fmt.Sprintf("\x00LISTEN_PID=%d\x00", pid))
			if shimmed == c.direct {
				t.Errorf("node started through the shim: %v, want %v", shimmed, !c.direct)
			}
		})
	}
}
