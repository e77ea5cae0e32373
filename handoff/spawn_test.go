package handoff

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childTimeout bounds how long a test waits for a child's output.
const childTimeout = 15 * time.Second

// procResult is what a started process left behind.
type procResult struct {
	pid            int
	stdout, stderr string
	exitCode       int
}

// runProc starts p with fresh output pipes, waits until it exits and returns its
// output and exit code. The process group is killed if the wait runs out.
func runProc(t *testing.T, p Proc) procResult {
	t.Helper()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	defer errR.Close()
	p.Stdout, p.Stderr = outW, errW
	proc, err := Start(p)
	outW.Close()
	errW.Close()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	deadline := time.Now().Add(childTimeout)
	outR.SetReadDeadline(deadline)
	errR.SetReadDeadline(deadline)
	var stderr []byte
	errDone := make(chan struct{})
	go func() {
		defer close(errDone)
		stderr, _ = io.ReadAll(errR)
	}()
	stdout, rerr := io.ReadAll(outR)
	<-errDone
	if rerr != nil {
		syscall.Kill(-proc.Pid, syscall.SIGKILL)
		proc.Wait()
		t.Fatalf("reading the child's output: %v (stderr %q)", rerr, stderr)
	}
	st, err := proc.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return procResult{pid: proc.Pid, stdout: string(stdout), stderr: string(stderr), exitCode: st.ExitCode()}
}

func TestStartWorkerContract(t *testing.T) {
	exe := testBinary(t)
	tcp := mustOpen(t, "tcp", "127.0.0.1:0", true)
	sock := filepath.Join(shortDir(t), "admin.sock")
	uds := mustOpen(t, "unix", sock, false)
	tcpAddr, err := tcp.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	before := fdCount(t)
	ipc, err := NewIPCChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ipc.Parent.Close()

	res := runProc(t, Proc{
		Shim: exe,
		Argv: []string{exe},
		Env: []string{
			helperEnv + "=print-env", noRaceExitSleep,
			"WRITE_EXTRA=1",
			// Stale values from the agent's own environment must not win.
			"LISTEN_PID=1", "LISTEN_FDS=7", "LISTEN_FDNAMES=stale",
		},
		Listeners: []Bound{{Listener: tcp, Name: "http"}, {Listener: uds, Name: "admin"}},
		Extra:     []*os.File{ipc.Child},
	})
	ipc.Child.Close()
	if res.exitCode != 0 {
		t.Fatalf("helper exited %d; stderr:\n%s", res.exitCode, res.stderr)
	}
	var rep childReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("helper output %q: %v", res.stdout, err)
	}

	if rep.PID != res.pid {
		t.Errorf("the app runs as pid %d, Start returned %d: the shim must exec in place", rep.PID, res.pid)
	}
	if rep.ListenFDs != "2" {
		t.Errorf("LISTEN_FDS = %q, want 2", rep.ListenFDs)
	}
	if rep.ListenPID != strconv.Itoa(rep.PID) {
		t.Errorf("LISTEN_PID = %q, want the app's own pid %d", rep.ListenPID, rep.PID)
	}
	if rep.ListenFDNames != "http:admin" {
		t.Errorf("LISTEN_FDNAMES = %q, want http:admin", rep.ListenFDNames)
	}
	if want := []string{tcpAddr, sock}; !slices.Equal(rep.Socknames, want) {
		t.Errorf("getsockname of fds 3, 4 = %q, want %q", rep.Socknames, want)
	}
	if want := []bool{true, false}; !slices.Equal(rep.Nonblock, want) {
		t.Errorf("O_NONBLOCK of fds 3, 4 in the child = %v, want %v", rep.Nonblock, want)
	}
	if rep.Pgid != rep.PID {
		t.Errorf("getpgid = %d, want the worker in its own group %d", rep.Pgid, rep.PID)
	}
	if rep.Pdeathsig != 0 {
		t.Errorf("PR_GET_PDEATHSIG = %d, want 0: a worker must outlive its agent (a next one adopts it)", rep.Pdeathsig)
	}
	if rep.NotifySocket != "" {
		t.Errorf("NOTIFY_SOCKET = %q, want unset", rep.NotifySocket)
	}
	if !rep.ExtraWritten {
		t.Errorf("writing the extra fd 5 failed: %s", rep.ExtraErr)
	} else {
		got, err := io.ReadAll(ipc.Parent) // the child exited and our copy of Child is closed: EOF
		if err != nil || string(got) != "extra\n" {
			t.Errorf("read on the parent end = %q, %v; want the extra fd to be the channel", got, err)
		}
	}

	// golang/go#43894: handing a socket to a child must not switch the
	// shared description to blocking mode.
	if nb, err := tcp.Nonblocking(); err != nil || !nb {
		t.Errorf("after Start the TCP listener is nonblocking=%v (%v), want true", nb, err)
	}
	if nb, err := uds.Nonblocking(); err != nil || nb {
		t.Errorf("after Start the unix listener is nonblocking=%v (%v), want false", nb, err)
	}
	ipc.Parent.Close()
	if after := fdCount(t); after != before {
		t.Errorf("Start leaked descriptors: %d before, %d after", before, after)
	}
}

// A socket file that came from the net package (as an inherited one may)
// is switched to blocking mode by (*os.File).Fd: Start must not call it.
func TestStartKeepsAdoptedSocketNonblocking(t *testing.T) {
	exe := testBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	l := Adopt(f, "tcp", ln.Addr().String())
	defer l.Close()
	if nb, err := l.Nonblocking(); err != nil || !nb {
		t.Fatalf("adopted socket nonblocking=%v (%v) before Start, want true", nb, err)
	}
	res := runProc(t, Proc{Shim: exe, Argv: []string{exe}, Env: []string{helperEnv + "=print-env", noRaceExitSleep},
		Listeners: []Bound{{Listener: l, Name: "http"}}})
	var rep childReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("helper output %q (exit %d, stderr %q): %v", res.stdout, res.exitCode, res.stderr, err)
	}
	if want := []string{ln.Addr().String()}; !slices.Equal(rep.Socknames, want) {
		t.Errorf("getsockname of fd 3 = %q, want %q", rep.Socknames, want)
	}
	if nb, err := l.Nonblocking(); err != nil || !nb {
		t.Errorf("after Start the adopted socket is nonblocking=%v (%v), want true (golang/go#43894)", nb, err)
	}
	if !slices.Equal(rep.Nonblock, []bool{true}) {
		t.Errorf("O_NONBLOCK of fd 3 in the child = %v, want [true]", rep.Nonblock)
	}
}

func TestStartNoListeners(t *testing.T) {
	exe := testBinary(t)
	res := runProc(t, Proc{Shim: exe, Argv: []string{exe}, Env: []string{helperEnv + "=print-env", noRaceExitSleep}})
	if res.exitCode != 0 {
		t.Fatalf("helper exited %d; stderr:\n%s", res.exitCode, res.stderr)
	}
	var rep childReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("helper output %q: %v", res.stdout, err)
	}
	if rep.ListenFDs != "0" || rep.ListenPID != strconv.Itoa(rep.PID) || rep.ListenFDNames != "" {
		t.Errorf("LISTEN_FDS=%q LISTEN_PID=%q LISTEN_FDNAMES=%q, want 0, %d, empty",
			rep.ListenFDs, rep.ListenPID, rep.ListenFDNames, rep.PID)
	}
}

func TestStartDir(t *testing.T) {
	exe := testBinary(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	res := runProc(t, Proc{Shim: exe, Argv: []string{"/bin/sh", "-c", "pwd"}, Dir: dir})
	if res.exitCode != 0 || strings.TrimSpace(res.stdout) != dir {
		t.Errorf("pwd printed %q (exit %d), want %q", res.stdout, res.exitCode, dir)
	}
}

func TestStartMissingCommand(t *testing.T) {
	exe := testBinary(t)
	empty := t.TempDir()
	noexec := filepath.Join(empty, "app")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		argv   []string
		code   int
		stderr string
	}{
		{[]string{"/nonexistent/deployd-test-app"}, 127, "/nonexistent/deployd-test-app"},
		{[]string{"deployd-test-no-such-command"}, 127, "not found in PATH"},
		{[]string{noexec}, 126, "permission denied"},
	} {
		res := runProc(t, Proc{Shim: exe, Argv: tc.argv, Env: []string{"PATH=" + empty}})
		if res.exitCode != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.argv, res.exitCode, tc.code, res.stderr)
		}
		if !strings.Contains(res.stderr, "deployd exec") || !strings.Contains(res.stderr, tc.stderr) {
			t.Errorf("%q: stderr %q, want it to say %q", tc.argv, res.stderr, tc.stderr)
		}
	}
}

func TestStartErrors(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := Start(Proc{Shim: testBinary(t), Stdout: w, Stderr: w}); err == nil {
		t.Error("Start with an empty command: no error")
	}
	before := fdCount(t)
	_, err = Start(Proc{Shim: "/nonexistent/deployd", Argv: []string{"app"}, Stdout: w, Stderr: w})
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "app") {
		t.Errorf("Start with a missing shim: %v, want ENOENT naming the app", err)
	}
	if after := fdCount(t); after != before {
		t.Errorf("failed Start leaked descriptors: %d before, %d after", before, after)
	}
}

// RunShim's failure paths return instead of exec'ing, so they can run in
// this process.
func TestRunShimFailures(t *testing.T) {
	noexec := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(noexec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	os.Stderr = null // RunShim explains its failures there
	defer func() { os.Stderr = stderr }()

	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"--"}, 2},
		{[]string{"--", "/nonexistent/deployd-test-app"}, 127},
		{[]string{"--", "deployd-test-no-such-command-" + strconv.Itoa(os.Getpid())}, 127},
		{[]string{"--", noexec}, 126},
	} {
		if got := RunShim(tc.args); got != tc.code {
			t.Errorf("RunShim(%q) = %d, want %d", tc.args, got, tc.code)
		}
	}
}

func TestWithoutContractVars(t *testing.T) {
	in := []string{"A=1", "LISTEN_FDS=3", "LISTEN_PID=9", "LISTEN_FDNAMES=x", "TABLEFLIP_HAS_PARENT_7DIU3=1", "B=LISTEN_FDS=2", "LISTEN_FDS_X=1"}
	want := []string{"A=1", "B=LISTEN_FDS=2", "LISTEN_FDS_X=1"}
	if got := without(in, startVar); !slices.Equal(got, want) {
		t.Errorf("without(startVar) = %q, want %q", got, want)
	}
	if ShimArg != "__deployd-exec" {
		t.Errorf("ShimArg changed to %q: old agents exec new binaries with it", ShimArg)
	}
}

// A worker's or hook's environment holds nothing of the agent's but the
// documented variables and those env_inherit names (never the agent's
// own), with the app's user's HOME/USER/LOGNAME and the app's env on top,
// each name once.
func TestCleanEnv(t *testing.T) {
	agent := []string{"PATH=/agent/bin", "HOME=/root", "USER=root", "LOGNAME=root", "SHELL=/bin/sh",
		"LANG=C.UTF-8", "LC_TIME=de_DE", "TZ=UTC", "CREDENTIALS_DIRECTORY=/run/credentials/deployd.service",
		"SECRET_AGENT_TOKEN=s3cret", "HTTP_PROXY=http://proxy", "NOTIFY_SOCKET=/run/n", "LISTEN_FDS=3",
		"DEPLOYD_SOCKET=/run/d.sock", "WATCHDOG_USEC=1", "TABLEFLIP_HAS_PARENT_7DIU3=1", "NODE_OPTIONS=--inspect"}
	for _, tc := range []struct {
		name         string
		acct         *Account
		inherit, app []string
		want         []string
	}{
		{"agent's user", nil, nil, nil, []string{"PATH=/agent/bin", "HOME=/root", "USER=root", "LOGNAME=root",
			"SHELL=/bin/sh", "LANG=C.UTF-8", "LC_TIME=de_DE", "TZ=UTC", "CREDENTIALS_DIRECTORY=/run/credentials/deployd.service"}},
		{"app's user, inherit, env", &Account{Name: "web", Home: "/srv/web"},
			[]string{"HTTP_PROXY", "NOTIFY_SOCKET", "DEPLOYD_SOCKET", "WATCHDOG_USEC", "MISSING"},
			[]string{"TZ=Europe/Paris", "MODE=prod", "PATH=/app/bin"},
			[]string{"PATH=/app/bin", "LANG=C.UTF-8", "LC_TIME=de_DE", "TZ=Europe/Paris",
				"CREDENTIALS_DIRECTORY=/run/credentials/deployd.service", "HOME=/srv/web", "USER=web", "LOGNAME=web",
				"HTTP_PROXY=http://proxy", "MODE=prod"}},
	} {
		if got := CleanEnv(agent, tc.acct, tc.inherit, tc.app); !slices.Equal(got, tc.want) {
			t.Errorf("%s: CleanEnv =\n%q\nwant\n%q", tc.name, got, tc.want)
		}
	}
	if got := CleanEnv([]string{"SECRET=1"}, nil, nil, nil); !slices.Equal(got, []string{"PATH=" + DefaultPath}) {
		t.Errorf("CleanEnv of an agent without PATH = %q, want the default PATH alone", got)
	}
}
