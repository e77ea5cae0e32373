package nodejs

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"
)

// preloadRun is node running js with the preload, a listener on a free port
// as fd 4 and the channel as fd 3 (as the agent passes them, at other numbers).
type preloadRun struct {
	port  int
	cmd   *exec.Cmd
	out   *bufio.Scanner
	ctl   *bufio.Scanner
	ctlCh chan string
	errs  *syncbuf.Buffer // node's stderr, also copied to the test's
}

func needNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not installed, and CI must run the preload tests: install Node.js 18+")
		}
		t.Skip("node not installed")
	}
}

func startPreload(t *testing.T, js string, ready bool) *preloadRun {
	t.Helper()
	return startPreloadOn(t, "tcp", "127.0.0.1:0", js, ready)
}

// startPreloadEnv is startPreload (ready = "notify") with extra variables for the app.
func startPreloadEnv(t *testing.T, js string, env []string) *preloadRun {
	t.Helper()
	return startPreloadWith(t, "tcp", "127.0.0.1:0", js, true, env)
}

func startPreloadOn(t *testing.T, network, address, js string, ready bool) *preloadRun {
	t.Helper()
	return startPreloadWith(t, network, address, js, ready, nil)
}

// startPreloadFile is startPreloadEnv with the app in a file of that name (app.mjs: an ES module).
func startPreloadFile(t *testing.T, file, js string, env []string) *preloadRun {
	t.Helper()
	return startPreloadWith(t, "tcp", "127.0.0.1:0", js, true, append(env, "TEST_FILE="+file))
}

func startPreloadWith(t *testing.T, network, address, js string, ready bool, extra []string) *preloadRun {
	t.Helper()
	needNode(t)
	ln, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	lf, err := ln.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "ctl"), os.NewFile(uintptr(fds[1]), "ctl-child")
	defer child.Close()
	t.Cleanup(func() { parent.Close() })
	dir := t.TempDir()
	p, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := 0
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	spec := &Spec{Preload: p, App: "web", ReportReady: ready, StopSignal: "SIGTERM", StopTimeout: 10 * time.Second,
		Listeners: []Listener{{network, ln.Addr().String()}}}
	app := filepath.Join(dir, "app.js")
	for _, kv := range extra {
		if f, ok := strings.CutPrefix(kv, "TEST_FILE="); ok {
			app = filepath.Join(dir, f)
		}
	}
	if err := os.WriteFile(app, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", app)
	env := append(os.Environ(), fmt.Sprintf("TEST_PORT=%d", port), "TEST_ADDR="+ln.Addr().String())
	cmd.Env = spec.Env(append(env, extra...), 3, 4)
	cmd.ExtraFiles = []*os.File{child, lf}
	errs := &syncbuf.Buffer{}
	cmd.Stderr = io.MultiWriter(os.Stderr, errs)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := &preloadRun{port: port, cmd: cmd, out: bufio.NewScanner(stdout), ctlCh: make(chan string, 100), errs: errs}
	go func() {
		sc := bufio.NewScanner(parent)
		for sc.Scan() {
			r.ctlCh <- sc.Text()
		}
		close(r.ctlCh)
	}()
	return r
}

// waitCtl waits for the channel line want; it returns the lines before it.
func (r *preloadRun) waitCtl(t *testing.T, want string) []string {
	t.Helper()
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-r.ctlCh:
			if !ok {
				t.Fatalf("channel closed before %q; got %q", want, seen)
			}
			if strings.HasPrefix(l, want) {
				return seen
			}
			seen = append(seen, l)
		case <-deadline:
			t.Fatalf("no %q on the channel within 10s; got %q", want, seen)
		}
	}
}

func (r *preloadRun) exit(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case <-done:
		return r.cmd.ProcessState.ExitCode()
	case <-time.After(10 * time.Second):
		t.Fatal("node did not exit within 10s")
		return -1
	}
}

const listenHead = `const http = require('http'), net = require('net');
const port = Number(process.env.TEST_PORT);
const h = (req, res) => res.end('ok');
function report(s) { return () => console.log(JSON.stringify(s.address())); }
`

func TestPreloadMapsEveryListenForm(t *testing.T) {
	for name, js := range map[string]string{
		"number":               `const s = http.createServer(h); s.listen(port, report(s));`,
		"numeric string":       `const s = http.createServer(h); s.listen(String(port), report(s));`,
		"options":              `const s = http.createServer(h); s.listen({port, host: '0.0.0.0'}, report(s));`,
		"port host cb":         `const s = http.createServer(h); s.listen(port, '127.0.0.1', report(s));`,
		"port host backlog cb": `const s = http.createServer(h); s.listen(port, '::', 511, report(s));`,
		"listening event":      `const s = http.createServer(h); s.on('listening', report(s)); s.listen(port);`,
		"net server":           `const s = net.createServer((c) => c.end('HTTP/1.0 200 OK\r\n\r\nok')); s.listen(port, report(s));`,
	} {
		t.Run(name, func(t *testing.T) {
			r := startPreload(t, listenHead+js, true)
			if !r.out.Scan() {
				t.Fatal("no address line from the app")
			}
			var addr struct{ Port int }
			if err := json.Unmarshal(r.out.Bytes(), &addr); err != nil || addr.Port != r.port {
				t.Fatalf("server.address() = %s (%v), want port %d", r.out.Text(), err, r.port)
			}
			r.waitCtl(t, "READY=1")
			c := &http.Client{Timeout: 5 * time.Second}
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", r.port))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" {
				t.Errorf("body %q", b)
			}
			c.CloseIdleConnections()
			r.cmd.Process.Signal(syscall.SIGTERM)
			if code := r.exit(t); code != 0 {
				t.Errorf("exit %d after SIGTERM, want 0", code)
			}
		})
	}
}

func TestPreloadUnlistedPortFails(t *testing.T) {
	r := startPreload(t, listenHead+`http.createServer(h).listen(port + 1, () => console.log('listening'));`, true)
	lines := r.waitCtl(t, "ERROR=")
	_ = lines
	if code := r.exit(t); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if r.out.Scan() {
		t.Errorf("the app's listen callback ran: %q", r.out.Text())
	}
}

func TestPreloadLeavesReadinessToNodeIPC(t *testing.T) {
	r := startPreload(t, listenHead+`const s = http.createServer(h); s.listen(port, () => console.log('up'));`, false)
	if !r.out.Scan() {
		t.Fatal("app did not start")
	}
	seen := r.waitCtl(t, "STATUS=serving")
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.exit(t)
	for l := range r.ctlCh {
		seen = append(seen, l)
	}
	for _, l := range seen {
		if l == "READY=1" {
			t.Errorf("READY=1 sent although readiness is the app's (node-ipc): %q", seen)
		}
	}
}

// An app whose own SIGTERM handler exits at once: the in-flight request
// still gets its answer (with Connection: close), a request sent on an idle
// keep-alive connection after the signal gets one too, then node exits 0.
func TestPreloadDrainsBeforeTheAppsOwnExit(t *testing.T) {
	r := startPreload(t, listenHead+`
const s = http.createServer((req, res) => {
  if (req.url === '/slow') { console.log('slow started'); setTimeout(() => res.end('slow'), 500); return; }
  res.end('ok');
});
s.listen(port, () => console.log('up'));
process.on('SIGTERM', () => process.exit(0));
`, true)
	if !r.out.Scan() || r.out.Text() != "up" {
		t.Fatalf("app did not start: %q", r.out.Text())
	}
	r.waitCtl(t, "READY=1")
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	get := func(c net.Conn, br *bufio.Reader, path string) (*http.Response, string) {
		t.Helper()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	idle, idleR := dial()
	if resp, _ := get(idle, idleR, "/"); resp.Close {
		t.Fatal("Connection: close before the drain")
	}
	slow, slowR := dial()
	fmt.Fprintf(slow, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	if !r.out.Scan() || r.out.Text() != "slow started" {
		t.Fatalf("no slow request: %q", r.out.Text())
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	resp, body := get(idle, idleR, "/")
	if body != "ok" || !resp.Close {
		t.Errorf("a request on an idle connection after the signal: %q, Connection: close %v", body, resp.Close)
	}
	resp, err := http.ReadResponse(slowR, nil)
	if err != nil {
		t.Fatalf("the in-flight request got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "slow" || !resp.Close {
		t.Errorf("in-flight request: %q, Connection: close %v", b, resp.Close)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want the app's 0", code)
	}
}

func TestPreloadListenAgainAfterCloseIsAClearError(t *testing.T) {
	r := startPreload(t, listenHead+`
const s = http.createServer(h);
s.listen(port, () => s.close(() => {
  const t = http.createServer(h);
  t.on('error', (e) => console.log(e.message));
  t.listen(port, report(t));
}));
`, true)
	if !r.out.Scan() {
		t.Fatal("no output")
	}
	if !strings.Contains(r.out.Text(), "closed its listener of port") {
		t.Errorf("second listen after close: %q", r.out.Text())
	}
}

// DEPLOYD_OLD_NODE=/path/to/node-16 runs this one (npm install node@16 gives one).
func TestPreloadRefusesOldNode(t *testing.T) {
	old := os.Getenv("DEPLOYD_OLD_NODE")
	if old == "" {
		t.Skip("set DEPLOYD_OLD_NODE to a node older than 18")
	}
	p, err := Install(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spec := &Spec{Preload: p, App: "web", ReportReady: true, StopSignal: "SIGTERM", StopTimeout: time.Second}
	cmd := exec.Command(old, "-e", "console.log('app ran')")
	cmd.Env = spec.Env(os.Environ(), -1, 4)
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "is too old for deployd's Node.js integration, which needs node 18") ||
		strings.Contains(string(out), "app ran") {
		t.Errorf("old node: %v\n%s", err, out)
	}
}

func TestPreloadMapsAUnixSocketByPath(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "web.sock")
	r := startPreloadOn(t, "unix", sock, `const http = require('http');
const s = http.createServer((req, res) => res.end('ok'));
s.listen(process.env.TEST_ADDR, () => console.log(s.address()));
`, true)
	r.waitCtl(t, "READY=1")
	if !r.out.Scan() || r.out.Text() != sock {
		t.Errorf("server.address() = %q, want %q", r.out.Text(), sock)
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	resp, err := c.Get("http://web/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Errorf("body %q", b)
	}
}
