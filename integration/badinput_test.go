package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"

	"github.com/deployd/deployd/agent/api"
)

// runAgentExpectingFailure runs `deployd agent` on body and returns its exit
// code and output; it must exit by itself.
func runAgentExpectingFailure(t *testing.T, body string) (int, string) {
	t.Helper()
	a := NewAgentDir(t, bins, body)
	cmd := exec.Command(bins.Deployd, "agent", "-c", a.Config)
	cmd.Dir = a.Dir
	cmd.Env = CleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("agent did not exit on bad input:\n%s", out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return code, string(out)
}

func TestAgentRefusesBadInput(t *testing.T) {
	parallel(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"busy port", appConfig("web", busyPort, 1, ""),
			[]string{fmt.Sprintf("app web: tcp://127.0.0.1:%d is already in use by ", busyPort),
				fmt.Sprintf(" (pid %d); stop it or choose another address\n", os.Getpid())}}, // this test holds it
		{"missing binary", `[apps.web]
command = ["./no-such-server"]
listen = ["tcp://127.0.0.1:1"]
`, []string{"deployd.toml:", "apps.web.command", "no-such-server"}},
		{"unknown key", appConfig("web", FreePort(t), 1, `colour = "blue"`),
			[]string{"deployd.toml:", "apps.web.colour", "unknown key"}},
		{"bad duration", appConfig("web", FreePort(t), 1, `stop_timeout = "forever"`),
			[]string{"deployd.toml:", "stop_timeout"}},
		{"bad signal", appConfig("web", FreePort(t), 1, `stop_signal = "SIGNOPE"`),
			[]string{"deployd.toml:", "stop_signal"}},
		{"bad listen url", `[apps.web]
command = ["%TESTAPP%"]
listen = ["http://127.0.0.1:80"]
`, []string{"deployd.toml:", "apps.web.listen"}},
		{"wrong type", appConfig("web", FreePort(t), 1, `nonblocking = "yes"`),
			[]string{"deployd.toml:", "nonblocking"}},
		{"not toml", "this is [not toml", []string{"deployd.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runAgentExpectingFailure(t, tc.body)
			if code != 2 {
				t.Errorf("exit code %d, want 2\n%s", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestConfigCheck(t *testing.T) {
	parallel(t)
	a := NewAgentDir(t, bins, appConfig("web", FreePort(t), 2, ""))
	if r := a.CLI("config", "check", "-c", a.Config); r.Code != 0 || !strings.Contains(r.Stdout, "ok") {
		t.Errorf("config check of a good file: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	a.WriteConfig(appConfig("web", FreePort(t), 2, `ready = "sometimes"`))
	r := a.CLI("config", "check", "-c", a.Config)
	if r.Code != 2 || !strings.Contains(r.Stderr, "apps.web.ready") {
		t.Errorf("config check of a bad file: exit %d\n%s", r.Code, r.Stderr)
	}
}

func TestUnreachableAgentExit3(t *testing.T) {
	parallel(t)
	a := NewAgentDir(t, bins, "")
	r := a.CLI("status")
	if r.Code != 3 || !strings.Contains(r.Stderr, a.Socket) {
		t.Errorf("status without an agent: exit %d, want 3 naming the socket:\n%s", r.Code, r.Stderr)
	}
}

func TestOtherUIDIsRefused(t *testing.T) {
	parallel(t)
	if os.Getuid() != 0 {
		skipOrFail(t, "needs root to run a client as nobody")
	}
	a := StartAgent(t, bins, appConfig("web", FreePort(t), 1, ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	// The socket is 0600: the kernel refuses nobody.
	r := a.CLIAs(nobody, "status", "--socket", a.Socket)
	if r.Code != 3 || !strings.Contains(r.Stderr, "permission denied") {
		t.Errorf("nobody on a 0600 socket: exit %d\n%s", r.Code, r.Stderr)
	}
	// Even when the file mode lets it connect, SO_PEERCRED refuses it.
	if err := os.Chmod(a.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	r = a.CLIAs(nobody, "status", "--socket", a.Socket)
	if r.Code != 1 || !strings.Contains(r.Stderr, "uid 65534 may not control this agent") {
		t.Errorf("nobody through SO_PEERCRED: exit %d\n%s", r.Code, r.Stderr)
	}
	r = a.CLIAs(nobody, "shutdown", "--socket", a.Socket)
	if r.Code == 0 {
		t.Errorf("nobody could shut the agent down")
	}
	if st := a.Status(); !AllReady(st, "web", 1) {
		t.Errorf("agent changed after refused requests: %+v", st)
	}
}

func TestControlAPIRejectsBadRequests(t *testing.T) {
	parallel(t)
	a := StartAgent(t, bins, appConfig("web", FreePort(t), 1, ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	raw := func(method, path, body string) (int, string) {
		c, err := net.Dial("unix", a.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			method, path, len(body), body)
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		var code int
		fmt.Sscanf(line, "HTTP/1.1 %d", &code)
		rest := new(strings.Builder)
		br.WriteTo(rest)
		return code, rest.String()
	}
	if code, body := raw("POST", api.PathReload, "{not json"); code != 400 || !strings.Contains(body, "not valid JSON") {
		t.Errorf("non-JSON reload: %d %s", code, body)
	}
	big := `{"apps":["` + strings.Repeat("a", api.MaxRequestBytes+10) + `"]}`
	if code, _ := raw("POST", api.PathReload, big); code != 413 {
		t.Errorf("oversized request: %d, want 413", code)
	}
	if code, body := raw("POST", api.PathRestart, `{"app":"nope"}`); code != 404 || !strings.Contains(body, "unknown app") {
		t.Errorf("restart of an unknown app: %d %s", code, body)
	}
	if code, _ := raw("GET", "/v1/nothing", ""); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
	if st := a.Status(); !AllReady(st, "web", 1) {
		t.Errorf("agent changed after bad requests: %+v", st)
	}
}

func TestDemoServes(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	port := FreePort(t)
	sock := filepath.Join(dir, "demo.sock")
	cmd := exec.Command(bins.Deployd, "demo", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--instances", "2", "--socket", sock, "--dir", dir)
	cmd.Env = CleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Error("demo did not stop on SIGINT")
		}
	}()
	cl := api.NewClient(sock)
	if err := cl.WaitReady(context.Background(), 30*time.Second); err != nil {
		t.Fatalf("demo agent: %v\n%s", err, out.String())
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "Try, in another terminal") {
		if time.Now().After(deadline) {
			t.Fatalf("demo never printed what to try:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	body, err := get(t, port, "/")
	if err != nil || !strings.Contains(body, "hello from deployd demo worker") || !strings.Contains(body, "pid") {
		t.Fatalf("demo answer %q, %v", body, err)
	}
}
