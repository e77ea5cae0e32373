package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{"TESTAPP_VERSION": "v9", "TESTAPP_STARTUP_DELAY": "2s", "TESTAPP_NEVER_READY": "true"}
	c, err := parseConfig([]string{"-version", "v10"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.version != "v10" || c.startupDelay != 2*time.Second || !c.neverReady || c.exitBeforeReady != -1 || c.ready != "notify" {
		t.Errorf("flag must win over env, env over default: %+v", c)
	}
	for _, bad := range [][]string{{"-ready", "nope"}, {"-ready", "log", "-notify-from-child"}, {"extra"}} {
		if _, err := parseConfig(bad, func(string) string { return "" }); err == nil {
			t.Errorf("parseConfig(%q): no error", bad)
		}
	}
	if _, err := parseConfig(nil, func(k string) string { return map[string]string{"TESTAPP_SLOW": "x"}[k] }); err == nil {
		t.Error("bad TESTAPP_SLOW: no error")
	}
}

func TestListenServesAndDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	p := startApp(t, []string{"DEPLOYD_WORKER=3"}, "-listen", "127.0.0.1:0", "-version", "v7", "-ready", "log")
	base := "http://" + p.startedAddr(t)
	p.stdout.waitFor(t, func(s string) bool { return s == "listening ready version=v7" })

	resp, body := get(t, base+"/")
	if want := fmt.Sprintf("version=v7 pid=%d slot=3\n", p.pid()); resp.StatusCode != 200 || body != want {
		t.Errorf("GET / = %d %q, want 200 %q", resp.StatusCode, body, want)
	}
	if v := resp.Header.Get("X-Version"); v != "v7" {
		t.Errorf("X-Version = %q", v)
	}
	if _, body := get(t, base+"/healthz"); body != "ok" {
		t.Errorf("GET /healthz = %q", body)
	}
	if resp, _ := get(t, base+"/alloc?mb=4"); resp.StatusCode != 200 {
		t.Errorf("GET /alloc = %d", resp.StatusCode)
	}
	if resp, _ := get(t, base+"/slow?ms=x"); resp.StatusCode != 400 {
		t.Errorf("GET /slow?ms=x = %d, want 400", resp.StatusCode)
	}
	get(t, base+"/log?n=3")
	p.stdout.waitFor(t, func(s string) bool { return s == fmt.Sprintf("log 3 %d 3", p.pid()) })

	// A request in flight at SIGTERM finishes, and its keep-alive connection is closed.
	type result struct {
		resp *http.Response
		body string
	}
	slow := make(chan result, 1)
	go func() {
		c := &http.Client{Timeout: waitTimeout}
		defer c.CloseIdleConnections()
		resp, err := c.Get(base + "/slow?ms=1000")
		if err != nil {
			slow <- result{}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		slow <- result{resp, string(body)}
	}()
	p.stderr.waitFor(t, func(s string) bool { return strings.HasPrefix(s, "testapp: slow request started ms=1000") })
	p.signal(t, syscall.SIGTERM)
	r := <-slow
	if r.resp == nil || r.resp.StatusCode != 200 || !strings.HasPrefix(r.body, "version=v7 ") {
		t.Errorf("in-flight request during SIGTERM: %+v", r)
	} else if !r.resp.Close {
		t.Error("in-flight response during shutdown lacks Connection: close")
	}
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	p.stderr.waitFor(t, func(s string) bool { return strings.HasPrefix(s, "testapp: stopped version=v7") })
}

// TestSocketActivation passes a listening socket as fd 3 the way deployd and systemd do
// and checks that readiness and stopping arrive on NOTIFY_SOCKET from the worker's pid.
func TestSocketActivation(t *testing.T) {
	t.Parallel()
	addr, f := listenerFile(t)
	ns := listenNotify(t)
	p := startActivated(t, []*os.File{f}, []string{ns.env(), "DEPLOYD_WORKER=1"}, "-version", "v2")
	f.Close() // the app holds its own copy now

	msg, pid, ok := ns.recv(t, waitTimeout)
	if !ok || !hasLine(msg, "READY=1") || pid != p.pid() {
		t.Fatalf("notify: %q from pid %d (ok=%v), want READY=1 from %d", msg, pid, ok, p.pid())
	}
	_, body := get(t, "http://"+addr+"/")
	if want := fmt.Sprintf("version=v2 pid=%d slot=1\n", p.pid()); body != want {
		t.Errorf("GET / = %q, want %q", body, want)
	}
	p.signal(t, syscall.SIGTERM)
	if msg, pid, ok := ns.recv(t, waitTimeout); !ok || !hasLine(msg, "STOPPING=1") || pid != p.pid() {
		t.Errorf("notify after SIGTERM: %q from %d (ok=%v), want STOPPING=1", msg, pid, ok)
	}
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code = %d, want 0", code)
	}
}

func TestNotifyFromChild(t *testing.T) {
	t.Parallel()
	_, f := listenerFile(t)
	ns := listenNotify(t)
	p := startActivated(t, []*os.File{f}, []string{ns.env()}, "-notify-from-child")
	f.Close()
	msg, pid, ok := ns.recv(t, waitTimeout)
	if !ok || msg != "READY=1" {
		t.Fatalf("notify: %q (ok=%v), want READY=1", msg, ok)
	}
	if pid == p.pid() {
		t.Errorf("READY=1 came from the worker (%d) itself, want a child of it", pid)
	}
}

func TestNeverReadyServes(t *testing.T) {
	t.Parallel()
	ns := listenNotify(t)
	p := startApp(t, []string{ns.env()}, "-listen", "127.0.0.1:0", "-never-ready")
	addr := p.startedAddr(t)
	if _, body := get(t, "http://"+addr+"/"); !strings.HasPrefix(body, "version=v1 ") {
		t.Errorf("GET / = %q", body)
	}
	if msg, _, ok := ns.recv(t, 200*time.Millisecond); ok {
		t.Errorf("-never-ready sent %q", msg)
	}
}

func TestNodeIPCReady(t *testing.T) {
	t.Parallel()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "ipc"), os.NewFile(uintptr(fds[1]), "ipc-child")
	conn, err := net.FileConn(ours) // a dup that supports deadlines
	ours.Close()
	if err != nil {
		theirs.Close()
		t.Fatal(err)
	}
	defer conn.Close()
	cmd := exec.Command(testappBin, "-listen", "127.0.0.1:0", "-ready", "node-ipc")
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	startCmd(t, cmd, []string{"NODE_CHANNEL_FD=3"})
	theirs.Close()

	conn.SetReadDeadline(time.Now().Add(waitTimeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "\"ready\"\n" {
		t.Errorf("node channel got %q, %v; want %q", line, err, "\"ready\"\n")
	}
}

func TestNoListenerExits3(t *testing.T) {
	t.Parallel()
	p := startApp(t, []string{"LISTEN_FDS=1", "LISTEN_PID=1"})
	if code := p.exitCode(t); code != exitNoListener {
		t.Errorf("exit code = %d, want %d", code, exitNoListener)
	}
	p.stderr.waitFor(t, func(s string) bool { return strings.Contains(s, "no listener") })
}

func TestEnvFlags(t *testing.T) {
	t.Parallel()
	p := startApp(t, []string{"TESTAPP_VERSION=v9", "TESTAPP_EXIT_BEFORE_READY=7", "TESTAPP_LISTEN=127.0.0.1:0"}, "-version", "v10")
	p.stdout.waitFor(t, func(s string) bool { return strings.HasPrefix(s, "started version=v10 ") })
	if code := p.exitCode(t); code != 7 {
		t.Errorf("exit code = %d, want 7 (TESTAPP_EXIT_BEFORE_READY)", code)
	}
}

func TestCrashAfter(t *testing.T) {
	t.Parallel()
	p := startApp(t, nil, "-listen", "127.0.0.1:0", "-ready", "delay", "-crash-after", "50ms")
	if code := p.exitCode(t); code != 1 {
		t.Errorf("exit code = %d, want 1", code)
	}
}

func TestIgnoreSIGTERM(t *testing.T) {
	t.Parallel()
	p := startApp(t, nil, "-listen", "127.0.0.1:0", "-ready", "log", "-ignore-sigterm")
	addr := p.startedAddr(t)
	p.stdout.waitFor(t, func(s string) bool { return strings.HasPrefix(s, "listening ready") })
	p.signal(t, syscall.SIGTERM)
	p.stderr.waitFor(t, func(s string) bool { return strings.Contains(s, "ignoring SIGTERM") })
	if resp, _ := get(t, "http://"+addr+"/"); resp.StatusCode != 200 {
		t.Errorf("GET / after ignored SIGTERM = %d", resp.StatusCode)
	}
	// Cleanup's SIGKILL to the group stops it, as deployd's stop_timeout would.
}

func TestLogSpam(t *testing.T) {
	t.Parallel()
	const n = 20000
	p := startApp(t, []string{"DEPLOYD_WORKER=0"}, "-listen", "127.0.0.1:0", "-log-spam", fmt.Sprint(n))
	addr := p.startedAddr(t)
	last := fmt.Sprintf("line 0 %d %d", p.pid(), n)
	p.stdout.waitFor(t, func(s string) bool { return s == last })
	all, _ := p.stdout.snapshot()
	i := 0
	for _, s := range all {
		if strings.HasPrefix(s, "line ") {
			i++
			if want := fmt.Sprintf("line 0 %d %d", p.pid(), i); s != want {
				t.Fatalf("spam line %d = %q, want %q", i, s, want)
			}
		}
	}
	if resp, _ := get(t, "http://"+addr+"/"); resp.StatusCode != 200 {
		t.Errorf("GET / after spam = %d", resp.StatusCode)
	}
}

// listenerFile opens a loopback TCP listener and returns its address and a file for it
// to pass to a child; the test's own listener is closed (it never accepts).
func listenerFile(t *testing.T) (string, *os.File) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return l.Addr().String(), f
}
