package workers

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/workers/nodejs"
)

// nodeDiscoverSpec is a spec of one node worker running js, with no
// listeners: what an app without a listen list is.
func nodeDiscoverSpec(t *testing.T, js string) *Spec {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not installed, and CI must run the Node.js tests: install Node.js 18+")
		}
		t.Skip("node not installed")
	}
	dir := t.TempDir()
	app := filepath.Join(dir, "app.js")
	if err := os.WriteFile(app, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := nodejs.Install(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	return &Spec{
		Release: "v1", Generation: 1, Argv: []string{node, app}, Dir: dir, Instances: 1,
		Ready: ReadyPolicy{Mode: ReadyNotify}, ReadyTimeout: 10 * time.Second,
		StopSignal: syscall.SIGTERM, StopTimeout: stopTimeout,
		Node: &nodejs.Spec{Preload: p, App: "web", ReportReady: true, StopSignal: "SIGTERM", StopTimeout: stopTimeout},
	}
}

// An app without a listen list is run once to learn its address: every
// listen form reports its address, and the process is gone before it
// serves (its listening callback never runs).
func TestDiscoverReportsTheAppsListen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ listen, want string }{
		{"3000", "tcp://0.0.0.0:3000"},
		{"'8080'", "tcp://0.0.0.0:8080"},
		{"4000, 'localhost'", "tcp://127.0.0.1:4000"},
		{"{port: 4001, host: '127.0.0.2'}", "tcp://127.0.0.2:4001"},
	} {
		js := "require('http').createServer((q, r) => r.end('hi')).listen(" + c.listen +
			", () => { console.log('SERVING'); });\nsetInterval(() => {}, 1000);\n"
		spec := nodeDiscoverSpec(t, js)
		s := newSupervisor(t, spec)
		got, err := s.Discover(spec)
		if err != nil || got != c.want {
			t.Errorf("listen(%s): Discover = %q, %v; want %q", c.listen, got, err, c.want)
		}
	}
}

// A listen on a unix socket the config does not name is the app's own
// (tsx's IPC pipe in its parent process): it binds it itself, and the
// discovery reports the port it serves after it.
func TestDiscoverLeavesTheAppsOwnUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "own.sock")
	js := "const net = require('net');\n" +
		"net.createServer(() => {}).listen(" + strconv.Quote(sock) + ", () => {\n" +
		"  require('http').createServer((q, r) => r.end('hi')).listen(3002);\n" +
		"});\nsetInterval(() => {}, 1000);\n"
	spec := nodeDiscoverSpec(t, js)
	s := newSupervisor(t, spec)
	got, err := s.Discover(spec)
	if err != nil || got != "tcp://0.0.0.0:3002" {
		t.Errorf("Discover = %q, %v; want the port after the app's own unix socket", got, err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the app's own unix socket was not bound by the app: %v", err)
	}
}

// An app that never listens is named, with the fix, within ready_timeout.
func TestDiscoverNamesAnAppThatNeverListens(t *testing.T) {
	t.Parallel()
	spec := nodeDiscoverSpec(t, "console.log('no server here'); setInterval(() => {}, 1000);\n")
	spec.ReadyTimeout = 2 * time.Second
	s := newSupervisor(t, spec)
	start := time.Now()
	_, err := s.Discover(spec)
	if !errors.Is(err, ErrNoListen) || !strings.Contains(err.Error(), "did not call listen within ready_timeout") ||
		!strings.Contains(err.Error(), `listen = ["tcp://0.0.0.0:PORT"]`) {
		t.Fatalf("Discover = %v; want ErrNoListen naming the timeout and the fix", err)
	}
	if took := time.Since(start); took > spec.ReadyTimeout+5*time.Second {
		t.Errorf("Discover took %s, ready_timeout is %s", took, spec.ReadyTimeout)
	}

	spec = nodeDiscoverSpec(t, "console.error('boom: missing module'); process.exit(3);\n")
	s = newSupervisor(t, spec)
	_, err = s.Discover(spec)
	if !errors.Is(err, ErrNoListen) || !strings.Contains(err.Error(), "boom: missing module") {
		t.Fatalf("Discover of an app that exits = %v; want ErrNoListen with its last output", err)
	}
}
