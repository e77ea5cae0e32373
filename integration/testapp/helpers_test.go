package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// testappBin is the real binary, built once per test run by TestMain.
var testappBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "testapp-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testappBin = filepath.Join(dir, "testapp")
	build := exec.Command("go", "build", "-o", testappBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "go build testapp:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil { // every process waited for, every pipe drained
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

const waitTimeout = 10 * time.Second

// proc is a started testapp. Its process group is killed and waited for in t.Cleanup.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *lines
	done           chan struct{} // closed when Wait returned
	err            error         // Wait's result, set before done is closed
}

// startApp starts the binary with args and a clean environment plus env.
func startApp(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(testappBin, args...), env)
}

// startActivated starts the binary with the files as fds 3.. and LISTEN_FDS set. A Go
// parent cannot set LISTEN_PID to the child's pid before exec, so a shell sets it and
// execs the app in the same process, as deployd's re-exec does.
func startActivated(t *testing.T, files []*os.File, env []string, args ...string) *proc {
	t.Helper()
	sh := []string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, testappBin}
	cmd := exec.Command("/bin/sh", append(sh, args...)...)
	cmd.ExtraFiles = files
	return startCmd(t, cmd, append(env, fmt.Sprintf("LISTEN_FDS=%d", len(files))))
}

func startCmd(t *testing.T, cmd *exec.Cmd, env []string) *proc {
	t.Helper()
	p := &proc{cmd: cmd, stdout: newLines(), stderr: newLines(), done: make(chan struct{})}
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("stdout of %v:\n%s\nstderr:\n%s", cmd.Args, p.stdout, p.stderr)
		}
	})
	return p
}

// cleanEnv is this process's environment without anything of the worker contract, so
// tests run under systemd or deployd do not leak their own sockets into the app.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "LISTEN_"), strings.HasPrefix(kv, "NOTIFY_SOCKET="),
			strings.HasPrefix(kv, "NODE_CHANNEL"), strings.HasPrefix(kv, "DEPLOYD_"),
			strings.HasPrefix(kv, envPrefix):
		default:
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// exitCode waits for the process to exit and returns its exit code.
func (p *proc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(waitTimeout):
		t.Fatalf("%v did not exit within %v", p.cmd.Args, waitTimeout)
		return -1
	}
}

// startedAddr waits for the startup line and returns its addr= field.
func (p *proc) startedAddr(t *testing.T) string {
	t.Helper()
	line := p.stdout.waitFor(t, func(s string) bool { return strings.HasPrefix(s, "started ") })
	_, addr, ok := strings.Cut(line, " addr=")
	if !ok {
		t.Fatalf("startup line %q has no addr=", line)
	}
	return addr
}

// lines collects a stream's lines for a test to wait on. Safe for concurrent use.
type lines struct {
	mu      sync.Mutex
	partial []byte
	all     []string
	changed chan struct{} // closed and replaced whenever a line completes
}

func newLines() *lines { return &lines{changed: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.all = append(l.all, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

func (l *lines) snapshot() ([]string, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...), l.changed
}

func (l *lines) String() string {
	all, _ := l.snapshot()
	return strings.Join(all, "\n")
}

// waitFor returns the first line that matches, waiting up to waitTimeout for it.
func (l *lines) waitFor(t *testing.T, match func(string) bool) string {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		all, changed := l.snapshot()
		for _, s := range all {
			if match(s) {
				return s
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no matching line within %v; got:\n%s", waitTimeout, strings.Join(all, "\n"))
		}
	}
}

// get does one GET with its own connection and returns the response and its body.
func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	return resp, string(body)
}

// notifySocket is a NOTIFY_SOCKET the test owns, with SO_PASSCRED on so each message
// comes with the sender's pid.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	return &notifySocket{path: path, conn: conn}
}

func (n *notifySocket) env() string { return "NOTIFY_SOCKET=" + n.path }

// recv returns the next message and its sender's pid, waiting at most d.
func (n *notifySocket) recv(t *testing.T, d time.Duration) (msg string, pid int, ok bool) {
	t.Helper()
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
	n.conn.SetReadDeadline(time.Now().Add(d))
	nb, noob, _, _, err := n.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		if os.IsTimeout(err) {
			return "", 0, false
		}
		t.Fatalf("notify socket: %v", err)
	}
	cmsgs, err := syscall.ParseSocketControlMessage(oob[:noob])
	if err != nil || len(cmsgs) == 0 {
		t.Fatalf("notify message %q without credentials: %v", buf[:nb], err)
	}
	cred, err := syscall.ParseUnixCredentials(&cmsgs[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:nb]), int(cred.Pid), true
}

// hasLine reports whether the sd_notify message has the line kv.
func hasLine(msg, kv string) bool {
	for _, l := range strings.Split(msg, "\n") {
		if l == kv {
			return true
		}
	}
	return false
}
