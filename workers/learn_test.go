package workers

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/handoff/bindtrap"
	"github.com/deployd/deployd/workers/nodejs"
)

// learnPolicy is a test's address policy for an app without a listen
// list: it records every bind it is asked (TCP, a port), and answers each
// with its one socket (on a free loopback port), or refuses them all.
type learnPolicy struct {
	t      testing.TB
	refuse syscall.Errno // refuse every bind with this, when set
	mu     sync.Mutex
	asked  []bindtrap.Request
	ln     *net.TCPListener
}

func (p *learnPolicy) policy([]bindtrap.Listen) bindtrap.Decide {
	return func(r bindtrap.Request) bindtrap.Decision {
		if !r.Stream || r.Addr.Port() == 0 {
			return bindtrap.Decision{}
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.asked = append(p.asked, r)
		if p.refuse != 0 {
			return bindtrap.Decision{Errno: p.refuse, Refused: "test policy: " + r.String() + " is not yours"}
		}
		if p.ln == nil {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				p.t.Error(err)
				return bindtrap.Decision{Errno: syscall.EACCES}
			}
			p.ln = ln.(*net.TCPListener)
			p.t.Cleanup(func() { ln.Close() })
		}
		return bindtrap.Decision{Sock: p.ln, Name: "learned"}
	}
}

// requests returns the binds the policy was asked.
func (p *learnPolicy) requests() []bindtrap.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bindtrap.Request(nil), p.asked...)
}

// addr is the address of the socket the policy answers with.
func (p *learnPolicy) addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// nodeLearnSpec is a spec of one node worker running js, with no
// listeners: what an app without a listen list is. Its binds are put to
// p (the agent's address policy in the product).
func nodeLearnSpec(t *testing.T, js string, p *learnPolicy) *Spec {
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
	pl, err := nodejs.Install(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	p.t = t
	return &Spec{
		Release: "v1", Generation: 1, Argv: []string{node, app}, Dir: dir, Instances: 1,
		Ready: ReadyPolicy{Mode: ReadyNotify}, ReadyTimeout: 10 * time.Second,
		StopSignal: syscall.SIGTERM, StopTimeout: stopTimeout,
		Node: &nodejs.Spec{Preload: pl, App: "web", ReportReady: true, StopSignal: "SIGTERM",
			StopTimeout: stopTimeout, Learn: true},
		BindTrap: true, BindPolicy: p.policy,
	}
}

// notReadyLines are the last output lines of the worker err says was not
// ready.
func notReadyLines(t *testing.T, err error) []string {
	t.Helper()
	var nr *NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("%v is not a NotReadyError", err)
	}
	return nr.Worker.LastLines()
}

// getBody GETs / from addr.
func getBody(t *testing.T, addr string) string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// An app without a listen list learns its address from its own bind in
// its real worker: every listen form's bind is put to the policy with the
// address the code asked for, answered with the policy's socket, and the
// worker is ready once it listens on it and serves there. No other
// process of the app runs first: its code runs once.
func TestLearnAnswersTheAppsOwnListen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ listen, want string }{
		{"3000", ":3000"},
		{"'8080'", ":8080"},
		{"4000, 'localhost'", "127.0.0.1:4000"},
		{"{port: 4001, host: '127.0.0.2'}", "127.0.0.2:4001"},
	} {
		marker := filepath.Join(t.TempDir(), "runs")
		js := "require('fs').appendFileSync(" + strconv.Quote(marker) + ", 'run\\n');\n" +
			"require('http').createServer((q, r) => r.end('hi')).listen(" + c.listen + ");\n"
		p := &learnPolicy{}
		s := newSupervisor(t, nodeLearnSpec(t, js, p))
		if err := s.Start(); err != nil {
			t.Fatalf("listen(%s): Start: %v", c.listen, err)
		}
		rs := p.requests()
		if len(rs) != 1 || !strings.HasSuffix(c.want, ":"+strconv.Itoa(int(rs[0].Addr.Port()))) {
			t.Fatalf("listen(%s): the policy was asked %v; want one bind of %s", c.listen, rs, c.want)
		}
		if host, _, _ := strings.Cut(c.want, ":"); host != "" && rs[0].Addr.Addr().String() != host {
			t.Errorf("listen(%s): bind of %s, want host %s", c.listen, rs[0].Addr, host)
		} else if host == "" && !rs[0].Addr.Addr().IsUnspecified() {
			t.Errorf("listen(%s): bind of %s, want every address", c.listen, rs[0].Addr)
		}
		if body := getBody(t, p.addr()); body != "hi" {
			t.Errorf("listen(%s): the learned socket answered %q", c.listen, body)
		}
		if b, err := os.ReadFile(marker); err != nil || string(b) != "run\n" {
			t.Errorf("listen(%s): the app's code ran %q (%v), want once", c.listen, b, err)
		}
		if src := s.Status().Workers[0].Socket; !strings.Contains(src, "node preload; answered bind (1 of 1") {
			t.Errorf("listen(%s): status socket %q, want the preload and the answered bind", c.listen, src)
		}
	}
}

// A listen on a unix socket the config does not name is the app's own
// (tsx's IPC pipe in its parent process): it binds it itself, the policy
// never sees it, and the port it serves after it is learned.
func TestLearnLeavesTheAppsOwnUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "own.sock")
	js := "const net = require('net');\n" +
		"net.createServer(() => {}).listen(" + strconv.Quote(sock) + ", () => {\n" +
		"  require('http').createServer((q, r) => r.end('hi')).listen(3002);\n" +
		"});\n"
	p := &learnPolicy{}
	s := newSupervisor(t, nodeLearnSpec(t, js, p))
	mustStart(t, s)
	if rs := p.requests(); len(rs) != 1 || rs[0].Addr.Port() != 3002 {
		t.Errorf("the policy was asked %v; want the bind of port 3002 only", rs)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the app's own unix socket was not bound by the app: %v", err)
	}
}

// An app that never listens is named, with the fix, within ready_timeout;
// one that exits says so with its last output.
func TestLearnNamesAnAppThatNeverListens(t *testing.T) {
	t.Parallel()
	spec := nodeLearnSpec(t, "console.log('no server here'); setInterval(() => {}, 1000);\n", &learnPolicy{})
	spec.ReadyTimeout = 2 * time.Second
	s := newSupervisor(t, spec)
	start := time.Now()
	err := s.Start()
	if err == nil || !strings.Contains(err.Error(), "never listened on a TCP port") ||
		!strings.Contains(err.Error(), `listen = ["tcp://0.0.0.0:PORT"]`) {
		t.Fatalf("Start = %v; want the app named as one that never listened, and the fix", err)
	}
	if took := time.Since(start); took > spec.ReadyTimeout+5*time.Second {
		t.Errorf("Start took %s, ready_timeout is %s", took, spec.ReadyTimeout)
	}
}

// A bind the policy refuses fails in the app as a bind would (here node's
// EADDRINUSE), and the error that says the worker was not ready carries
// the policy's words.
func TestLearnedBindRefused(t *testing.T) {
	t.Parallel()
	p := &learnPolicy{refuse: syscall.EADDRINUSE}
	js := "require('http').createServer((q, r) => r.end('hi')).listen(3003, '127.0.0.1');\n"
	spec := nodeLearnSpec(t, js, p)
	spec.Restart = RestartPolicy{MaxRestarts: 0}
	s := newSupervisor(t, spec)
	err := s.Start()
	want := "its bind was refused, nothing was changed: test policy: tcp 127.0.0.1:3003 is not yours"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start = %v; want %q", err, want)
	}
	if lines := fmt.Sprint(notReadyLines(t, err)); !strings.Contains(lines, "EADDRINUSE") {
		t.Errorf("the app's output %s does not show node's EADDRINUSE", lines)
	}
}
