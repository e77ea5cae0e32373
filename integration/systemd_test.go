package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// unitsConfig has two apps, tcp and unix listeners, a #name and a pid file.
func unitsConfig(p1, p2, p3 int) string {
	return fmt.Sprintf(`pid_file = "%%DIR%%/deployd.pid"

[apps.web]
command = ["%%TESTAPP%%"]
listen = ["tcp://127.0.0.1:%d", "unix://%%DIR%%/web.sock", "tcp://127.0.0.1:%d#admin"]
stop_timeout = "2m"

[apps.api]
command = ["%%TESTAPP%%"]
listen = ["tcp://:%d"]
`, p1, p2, p3)
}

func readUnit(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("unit %s: %v", name, err)
	}
	return string(b)
}

func requireLines(t *testing.T, name, text string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("%s lacks the line %q:\n%s", name, l, text)
		}
	}
}

func TestSystemdStartupUnitsPassVerify(t *testing.T) {
	parallel(t)
	p1, p2, p3 := FreePort(t), FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, unitsConfig(p1, p2, p3))
	bin, err := filepath.EvalSymlinks(bins.Deployd)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := a.CLI("startup", "systemd", "-c", a.Config, "--socket-unit", "--unit-dir", dir)
	if r.Code != 0 {
		t.Fatalf("startup systemd: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	units := []string{"deployd.service", "deployd-api.socket", "deployd-web.socket", "deployd-web-admin.socket"}
	for _, u := range units {
		if !strings.Contains(r.Stdout, "wrote "+filepath.Join(dir, u)) {
			t.Errorf("output does not say it wrote %s:\n%s", u, r.Stdout)
		}
	}
	for _, want := range []string{"systemctl daemon-reload", "systemctl enable --now deployd-api.socket deployd-web.socket deployd-web-admin.socket deployd"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("output lacks the next step %q:\n%s", want, r.Stdout)
		}
	}
	svc := readUnit(t, dir, "deployd.service")
	requireLines(t, "deployd.service", svc,
		"Type=notify", "NotifyAccess=all", "ExecStart="+bin+" agent -c "+a.Config,
		"ExecReload=/bin/kill -HUP $MAINPID", "KillMode=process",
		"ExecStop="+bin+" shutdown -c "+a.Config+" --main-pid=${MAINPID} --timeout 150s", "TimeoutStopSec=150", "Restart=on-failure",
		"PIDFile="+filepath.Join(a.Dir, "deployd.pid"), "WantedBy=multi-user.target",
		"Sockets=deployd-web.socket", "Requires=deployd-web.socket", "After=deployd-web.socket",
		"Sockets=deployd-web-admin.socket", "Sockets=deployd-api.socket")
	requireLines(t, "deployd-web.socket", readUnit(t, dir, "deployd-web.socket"),
		fmt.Sprintf("ListenStream=127.0.0.1:%d", p1), "ListenStream="+filepath.Join(a.Dir, "web.sock"),
		"FileDescriptorName=web", "Service=deployd.service", "WantedBy=sockets.target")
	requireLines(t, "deployd-web-admin.socket", readUnit(t, dir, "deployd-web-admin.socket"),
		fmt.Sprintf("ListenStream=127.0.0.1:%d", p2), "FileDescriptorName=admin")
	requireLines(t, "deployd-api.socket", readUnit(t, dir, "deployd-api.socket"),
		fmt.Sprintf("ListenStream=%d", p3), "FileDescriptorName=api")

	// --print writes nothing and prints the same units.
	pdir := t.TempDir()
	r = a.CLI("startup", "systemd", "-c", a.Config, "--socket-unit", "--print", "--unit-dir", pdir)
	if r.Code != 0 {
		t.Fatalf("startup systemd --print: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if ents, _ := os.ReadDir(pdir); len(ents) != 0 {
		t.Errorf("--print wrote %d files", len(ents))
	}
	if !strings.Contains(r.Stdout, "# "+filepath.Join(pdir, "deployd.service")+"\n"+svc) {
		t.Errorf("--print output differs from the written service unit:\n%s", r.Stdout)
	}
	// Without --socket-unit: the service alone, with no socket dependencies.
	sdir := t.TempDir()
	if r = a.CLI("startup", "systemd", "-c", a.Config, "--unit-dir", sdir, "--name", "edge"); r.Code != 0 {
		t.Fatalf("startup systemd --name edge: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if ents, _ := os.ReadDir(sdir); len(ents) != 1 || ents[0].Name() != "edge.service" {
		t.Errorf("want only edge.service, got %v", ents)
	}
	if s := readUnit(t, sdir, "edge.service"); strings.Contains(s, "Sockets=") || strings.Contains(s, ".socket") {
		t.Errorf("a service without --socket-unit names sockets:\n%s", s)
	}
	// A bad config is a usage error.
	if r = a.CLI("startup", "systemd", "-c", filepath.Join(a.Dir, "missing.toml"), "--print"); r.Code != 2 {
		t.Errorf("missing config: exit %d, want 2\n%s", r.Code, r.Stderr)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		skipOrFail(t, "systemd-analyze is not installed: the generated units were checked line by line only")
	}
	for _, set := range [][]string{
		{filepath.Join(sdir, "edge.service")},
		{filepath.Join(dir, units[0]), filepath.Join(dir, units[1]), filepath.Join(dir, units[2]), filepath.Join(dir, units[3])},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, analyze, append([]string{"verify", "--man=no"}, set...)...)
		cmd.Dir = filepath.Dir(set[0])
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("systemd-analyze verify %v: %v\n%s", set, err, out)
			continue
		}
		// verify exits 0 on warnings such as unknown keys: none may name our units.
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, filepath.Dir(set[0])) || regexp.MustCompile(`\b(deployd|edge)[\w.-]*\.(service|socket)\b`).MatchString(l) {
				t.Errorf("systemd-analyze verify warns about a generated unit: %s", l)
			}
		}
		t.Logf("systemd-analyze verify %d unit(s): ok %s", len(set), strings.TrimSpace(string(out)))
	}
}

// notifyListener is a fake NOTIFY_SOCKET: it collects the datagrams the
// agent sends systemd.
type notifyListener struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
	done chan struct{}
}

func listenNotify(t *testing.T, dir string) *notifyListener {
	t.Helper()
	n := &notifyListener{path: filepath.Join(dir, "systemd-notify.sock"), done: make(chan struct{})}
	var err error
	n.conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(n.done)
		buf := make([]byte, 4096)
		for {
			k, err := n.conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { n.conn.Close(); <-n.done })
	return n
}

// wait waits until a datagram matches re and returns it.
func (n *notifyListener) wait(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(20 * time.Second)
	for {
		n.mu.Lock()
		for _, m := range n.msgs {
			if rx.MatchString(m) {
				n.mu.Unlock()
				return m
			}
		}
		all := strings.Join(n.msgs, " | ")
		n.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no sd_notify message matches %q; got: %s", re, all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startActivated starts the agent of a under systemd-socket-activate, which
// binds listen (host:port) and execs the agent with the socket as fd 3 named
// fdname. The first connection starts it: that is the GET this function
// makes, which must succeed. The agent's whole process group is killed when
// the test ends.
func startActivated(t *testing.T, a *Agent, listen, fdname string, env ...string) {
	t.Helper()
	sa, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		skipOrFail(t, "systemd-socket-activate is not installed")
	}
	args := []string{"-l", listen, "--fdname=" + fdname, "-E", "PATH"}
	for _, e := range env {
		args = append(args, "-E", e)
	}
	args = append(args, a.Binary, "agent", "-c", a.Config, "--log-level", "debug")
	a.cmd = exec.Command(sa, args...)
	a.cmd.Dir = a.Dir
	a.cmd.Env = CleanEnv()
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.done = make(chan struct{})
	go func() { a.cmd.Wait(); close(a.done) }()
	pgid := a.cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	t.Cleanup(a.Stop)

	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(10 * time.Second)
	var resp *http.Response
	for {
		if resp, err = c.Get("http://" + listen + "/"); err == nil {
			break
		}
		// Refused until systemd-socket-activate has bound the address.
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			t.Fatalf("first request (it starts the agent): %v\n%s", err, a.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %s\n%s", resp.Status, a.Log())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := a.Client.Version(ctx); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("agent did not answer on its control socket\n%s", a.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// socketInode is the socket behind pid's fd, e.g. "socket:[123]".
func socketInode(t *testing.T, pid, fd int) string {
	t.Helper()
	s, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holds reports whether one of pid's descriptors is sock (a Go app moves
// its fd 3 elsewhere when it takes the listener).
func holds(t *testing.T, pid int, sock string) bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == sock {
			return true
		}
	}
	return false
}

// environ is pid's initial environment.
func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

func TestSocketActivationAgentServesOnGivenSocket(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, ""))
	notify := listenNotify(t, a.Dir)
	startActivated(t, a, fmt.Sprintf("127.0.0.1:%d", port), "web", "NOTIFY_SOCKET="+notify.path)

	pid, _ := agentPID(t, a)
	if pid != a.cmd.Process.Pid {
		t.Fatalf("agent pid %d, want %d (systemd-socket-activate execs the agent in place)", pid, a.cmd.Process.Pid)
	}
	if !strings.Contains(a.Log(), "adopted socket from systemd socket activation: app=web listen=tcp://127.0.0.1:") ||
		!strings.Contains(a.Log(), "matched_by=address") {
		t.Fatalf("the agent log does not say it adopted the socket:\n%s", a.Log())
	}
	st := a.WaitFor("2 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	given := socketInode(t, pid, 3)
	for _, w := range appOf(st, "web").Workers {
		if !holds(t, w.PID, given) {
			t.Errorf("worker %d does not hold the socket systemd gave the agent (%s)", w.PID, given)
		}
		env := environ(t, w.PID)
		if env["LISTEN_FDNAMES"] != "web" || env["LISTEN_PID"] != fmt.Sprint(w.PID) || env["NOTIFY_SOCKET"] == notify.path {
			t.Errorf("worker %d env: LISTEN_FDNAMES=%q LISTEN_PID=%q NOTIFY_SOCKET=%q", w.PID,
				env["LISTEN_FDNAMES"], env["LISTEN_PID"], env["NOTIFY_SOCKET"])
		}
	}
	if seen := identities(t, port, PIDs(appOf(st, "web"))); len(seen) != 2 {
		t.Errorf("both workers must serve on the given socket, saw %v", seen)
	}
	notify.wait(t, fmt.Sprintf(`(?m)^READY=1$[\s\S]*^MAINPID=%d$`, pid))
	notify.wait(t, `^STATUS=serving 2 ready workers of 1 app$`)

	// A handoff passes systemd's socket on; the new agent does not see LISTEN_*.
	a.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(30 * time.Second)
	var npid int
	for npid = pid; npid == pid; npid, _ = agentPID(t, a) {
		if time.Now().After(deadline) {
			t.Fatalf("no new agent after SIGHUP\n%s", a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("old agent %d still running 30s after SIGHUP\n%s", pid, a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, k := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		if v, ok := environ(t, npid)[k]; ok {
			t.Errorf("the new agent was started with %s=%s", k, v)
		}
	}
	notify.wait(t, fmt.Sprintf(`(?m)^READY=1$[\s\S]*^MAINPID=%d$`, npid))
	st = a.WaitFor("2 ready workers of the new agent", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	for _, w := range appOf(st, "web").Workers {
		if !holds(t, w.PID, given) {
			t.Errorf("after the handoff worker %d does not hold systemd's socket %s", w.PID, given)
		}
	}
	if seen := identities(t, port, PIDs(appOf(st, "web"))); len(seen) != 2 {
		t.Errorf("both new workers must serve, saw %v", seen)
	}

	a.Stop()
	notify.wait(t, `^STOPPING=1$`)
}

func TestSocketActivationMatchesByName(t *testing.T) {
	parallel(t)
	// The config names a port the agent never opens; systemd's socket named
	// "web" (the app's default listen name) on another port stands for it.
	cfgPort, port := FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", cfgPort, 1, ""))
	startActivated(t, a, fmt.Sprintf("127.0.0.1:%d", port), "web")
	if !strings.Contains(a.Log(), "matched_by=name") {
		t.Fatalf("the agent log does not say it matched the socket by name:\n%s", a.Log())
	}
	if _, err := get(t, port, "/"); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, cfgPort, "/"); err == nil {
		t.Errorf("the agent also opened the configured port %d", cfgPort)
	}
}
