// Package integration holds the end-to-end tests of deployd: they build the
// real deployd binary and a real test app, run the agent with real sockets,
// signals and processes, and put a bounded load on loopback ports. This file
// is the harness the tests and the benchmark command share.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/failpoint"
)

// Binaries are the programs a test run builds once.
type Binaries struct {
	Dir       string
	Deployd   string // reports version "test-1"
	DeploydV2 string // reports version "test-2"
	TestApp   string
}

// RepoRoot is the module root (the folder holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// ReleaseTags are the build tags of a release build of deployd (docs/install.md,
// "To get a binary"): they leave out code the agent never runs, urfave/cli's
// man-page generator and net/http's HTTP/2 (the control socket, metrics and
// artifact downloads speak HTTP/1.1), about 0.9 MiB of the agent's RSS. The
// tests and the benchmarks build deployd the same way.
const ReleaseTags = "urfave_cli_no_docs,nethttpomithttp2"

// Build compiles deployd (with the given version string) into dir/name.
func Build(dir, name, pkg, ver string) (string, error) {
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if pkg == "./cmd/deployd" {
		args = append(args, "-tags", ReleaseTags)
	}
	if ver != "" {
		args = append(args, "-ldflags", "-X github.com/deployd/deployd/internal/version.Version="+ver)
	}
	cgo := "CGO_ENABLED=0"
	if RaceBuild() && pkg == "./cmd/deployd" {
		args, cgo = append(args, "-race"), "CGO_ENABLED=1"
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), cgo)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// RaceBuild reports whether DEPLOYD_TEST_RACE=1 asks for a deployd built
// with the race detector; every agent's log is then checked for a report
// when it stops.
func RaceBuild() bool { return os.Getenv("DEPLOYD_TEST_RACE") == "1" }

// raceReport is how the race detector starts a report on stderr.
const raceReport = "WARNING: DATA RACE"

// BuildAll builds deployd and the test app into a new folder readable by
// every user (tests run the CLI as nobody too).
func BuildAll() (*Binaries, error) {
	dir, err := os.MkdirTemp("", "deployd-it-bin-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	b := &Binaries{Dir: dir}
	var wg sync.WaitGroup
	var e1, e2, e3 error
	wg.Add(2)
	go func() {
		defer wg.Done()
		b.Deployd, e1 = Build(dir, "deployd", "./cmd/deployd", "test-1")
		b.DeploydV2, e3 = Build(dir, "deployd-v2", "./cmd/deployd", "test-2")
	}()
	go func() { defer wg.Done(); b.TestApp, e2 = Build(dir, "testapp", "./integration/testapp", "") }()
	wg.Wait()
	if err := errors.Join(e1, e2, e3); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// FreePort returns a loopback TCP port that was free a moment ago, never
// the same twice in one test run. It is taken below the kernel's range of
// ephemeral ports (net.ipv4.ip_local_port_range), which outgoing
// connections take their local ports from: tests run in parallel, and
// another test's load (thousands of new connections a second) could
// otherwise take the port between FreePort and the agent's bind.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePorts.take()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// portRange is FreePort's range of ports, [lo, lo+n), and the offset of
// the next one to try.
type portRange struct {
	once  sync.Once
	mu    sync.Mutex
	lo, n int
	next  int
}

var freePorts portRange

// take returns the next port of the range that a listener can bind.
func (r *portRange) take() (int, error) {
	r.once.Do(r.init)
	r.mu.Lock()
	defer r.mu.Unlock()
	for range r.n {
		p := r.lo + r.next%r.n
		r.next++
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	if r.n == 0 { // no room below the ephemeral range: any free port
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	return 0, fmt.Errorf("FreePort: none of the loopback ports %d-%d is free", r.lo, r.lo+r.n-1)
}

// init puts the range just below the first ephemeral port (32768 by
// default): up to 10000 ports above 1024. The search starts at a random
// place, as other test runs on the machine pick from the same range.
func (r *portRange) init() {
	first := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				first = v
			}
		}
	}
	r.lo = max(first-10000, 1025)
	r.n = max(first-r.lo, 0)
	if r.n > 0 {
		r.next = rand.IntN(r.n)
	}
}

// Agent is a deployd agent process started by a test.
type Agent struct {
	t      testing.TB
	bins   *Binaries
	Dir    string // holds deployd.toml, state/, logs/, the socket
	Config string
	Socket string
	Client *api.Client
	// Binary is what `deployd agent` runs: bins.Deployd, or a copy of it in
	// Dir after UseOwnBinary (upgrades replace the file).
	Binary string
	cmd    *exec.Cmd
	log    *syncbuf.Buffer
	done   chan struct{}
	// cleanupSet: killLeftWorkers is registered (once per Agent).
	cleanupSet bool
	// CallTimeout bounds every CLI run and control call the harness makes
	// (default 3 minutes for the CLI, StatusTimeout for a status); a call
	// that misses it dumps the agent's goroutines into its log (SIGQUIT) and
	// fails the test, so that a deadlock is reported, not waited out.
	CallTimeout time.Duration
	// Env is added to the agent's environment (set before Start).
	Env []string
	// Journal returns the agent's log where the harness did not start the
	// agent and so holds none of it (the unit's journal under a real
	// systemd); failures print it beside the log the harness holds.
	Journal func() string
}

// failLog is what a failure prints of the agents' logs: the output of the
// agent the harness started and, with Journal, the journal.
func (a *Agent) failLog() string {
	out := a.log.String()
	if a.Journal != nil {
		out += "\nthe agents' journal:\n" + a.Journal()
	}
	return out
}

// UseOwnBinary makes the agent run from a copy of deployd in its folder, so
// that an upgrade can swap it. Call before Start.
func (a *Agent) UseOwnBinary() {
	a.t.Helper()
	a.Binary = filepath.Join(a.Dir, "deployd")
	CopyFile(a.t, a.bins.Deployd, a.Binary)
}

// CopyFile copies an executable file. cp writes it, not this process:
// a file this process had open for writing can be inherited, for the
// moment between fork and exec, by a child another test starts, and
// exec of the copy then fails with ETXTBSY ("text file busy", seen in
// CI; golang/go#22315).
func CopyFile(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %s %s: %v\n%s", src, dst, err, out)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
}

// NewAgentDir prepares a folder with config body (the [agent] table is
// added) without starting anything. %SOCKET% and %DIR% are replaced.
func NewAgentDir(t testing.TB, bins *Binaries, body string) *Agent {
	t.Helper()
	checkSlot(t)
	NoteSources()
	dir, err := os.MkdirTemp("", "deployd-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	a := &Agent{t: t, bins: bins, Dir: dir, Config: filepath.Join(dir, "deployd.toml"), Binary: bins.Deployd,
		Socket: filepath.Join(dir, "deployd.sock"), log: &syncbuf.Buffer{}}
	a.Client = api.NewClient(a.Socket)
	a.WriteConfig(body)
	return a
}

// WriteConfig replaces the config file (for a reload).
func (a *Agent) WriteConfig(body string) {
	a.t.Helper()
	head := fmt.Sprintf("[agent]\nsocket = %q\nstate_dir = \"state\"\nlog_dir = \"logs\"\n\n", a.Socket)
	body = strings.NewReplacer("%SOCKET%", a.Socket, "%DIR%", a.Dir, "%TESTAPP%", a.bins.TestApp).Replace(body)
	if err := os.WriteFile(a.Config, []byte(head+body), 0o644); err != nil {
		a.t.Fatal(err)
	}
}

// StartAgent starts `deployd agent` on body and waits until its socket answers.
func StartAgent(t testing.TB, bins *Binaries, body string) *Agent {
	t.Helper()
	a := NewAgentDir(t, bins, body)
	a.Start()
	return a
}

// Start starts the agent process and waits until it answers. The agent is
// stopped (SIGTERM, then SIGKILL) when the test ends.
func (a *Agent) Start() {
	a.t.Helper()
	a.cmd = exec.Command(a.Binary, "agent", "-c", a.Config, "--log-level", "debug")
	a.cmd.Dir = a.Dir
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.Env = CleanEnv(append([]string{"GORACE=atexit_sleep_ms=0"}, a.Env...)...)
	// The agent dies with the test process; its workers die with it.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	// Each start has its own: an agent that handed off may still be
	// waited for (its successor holds its stdout) when the next starts.
	cmd, done := a.cmd, make(chan struct{})
	a.done = done
	go func() { cmd.Wait(); close(done) }()
	if !a.cleanupSet {
		// Workers outlive agents (adoption): after Stop, kill whatever a
		// failed test left running, by the agents' records.
		a.cleanupSet = true
		a.t.Cleanup(a.killLeftWorkers)
	}
	a.t.Cleanup(a.Stop)
	a.t.Cleanup(a.checkRace) // runs after Stop (cleanups run last first)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if _, err := a.Client.Version(ctx); err == nil {
			break
		}
		select {
		case <-a.done:
			a.t.Fatalf("agent exited during start: %v\n%s", a.cmd.ProcessState, a.log.String())
		case <-ctx.Done():
			a.t.Fatalf("agent did not answer within 60s\n%s", a.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// killLeftWorkers SIGKILLs the process group of every worker recorded in
// state/agents/*.json that still runs (checked by its start time).
func (a *Agent) killLeftWorkers() {
	files, _ := filepath.Glob(filepath.Join(a.Dir, "state", "agents", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var rec struct {
			Apps map[string][]struct {
				PID       int    `json:"pid"`
				StartTime uint64 `json:"start_time"`
			} `json:"apps"`
		}
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		for _, ps := range rec.Apps {
			for _, p := range ps {
				if st, err := handoff.StartTime(p.PID); err == nil && st == p.StartTime {
					_ = syscall.Kill(-p.PID, syscall.SIGKILL)
					_ = syscall.Kill(p.PID, syscall.SIGKILL)
				}
			}
		}
	}
}

// PID is the agent's pid.
func (a *Agent) PID() int { return a.cmd.Process.Pid }

// Done is closed when the agent process has exited.
func (a *Agent) Done() <-chan struct{} { return a.done }

// ExitCode is the agent's exit code once Done.
func (a *Agent) ExitCode() int { return a.cmd.ProcessState.ExitCode() }

// Log is what the agent printed so far.
func (a *Agent) Log() string { return a.log.String() }

// Signal sends sig to the agent.
func (a *Agent) Signal(sig syscall.Signal) {
	_ = a.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM to the agent serving the socket (after upgrades, a
// descendant of the one Start started) and waits up to 30 s for it to be
// gone, then kills it. Safe to call twice.
func (a *Agent) Stop() {
	if a.cmd == nil || a.done == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	v, err := a.Client.Version(ctx)
	cancel()
	if err == nil && v.PID != a.cmd.Process.Pid {
		_ = syscall.Kill(v.PID, syscall.SIGTERM)
		deadline := time.Now().Add(30 * time.Second)
		for Alive(v.PID) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if Alive(v.PID) {
			_ = syscall.Kill(v.PID, syscall.SIGKILL)
			a.t.Errorf("agent %d did not stop within 30s of SIGTERM\n%s", v.PID, a.log.String())
		}
	}
	select {
	case <-a.done:
		return
	default:
	}
	a.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		a.t.Errorf("agent did not stop within 30s of SIGTERM\n%s", a.log.String())
	}
}

// checkRace fails the test when the race detector reported a data race in
// the agent (or an agent it handed off to: they share the log).
func (a *Agent) checkRace() {
	if log := a.log.String(); strings.Contains(log, raceReport) {
		a.t.Errorf("the race detector reported a data race in the agent:\n%s", log)
	}
}

// Status returns the agent's status.
func (a *Agent) Status() *api.Status {
	a.t.Helper()
	ctx, cancel := a.Ctx(StatusTimeout)
	defer cancel()
	st, err := a.Client.Status(ctx, "")
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		a.Stuck("status", err)
	}
	if err != nil {
		a.t.Fatalf("status: %v\n%s", err, a.failLog())
	}
	return st
}

// App returns one app's status.
func (a *Agent) App(name string) api.App {
	a.t.Helper()
	for _, app := range a.Status().Apps {
		if app.Name == name {
			return app
		}
	}
	a.t.Fatalf("app %s not in status", name)
	return api.App{}
}

// WaitFor polls status until cond holds or timeout passes (then fails).
func (a *Agent) WaitFor(what string, timeout time.Duration, cond func(*api.Status) bool) *api.Status {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := a.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("timed out after %s waiting for %s; last status: %+v\nagent log:\n%s", timeout, what, st, a.failLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AllReady reports whether app has n workers, all ready, none extra.
func AllReady(st *api.Status, app string, n int) bool {
	for _, ap := range st.Apps {
		if ap.Name != app {
			continue
		}
		if len(ap.Workers) != n {
			return false
		}
		for _, w := range ap.Workers {
			if w.State != "ready" {
				return false
			}
		}
		return true
	}
	return false
}

// Result of a CLI run.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// CLI runs the deployd CLI against this agent.
func (a *Agent) CLI(args ...string) Result {
	a.t.Helper()
	return a.CLIAs(nil, args...)
}

// CLIAs runs the CLI with credentials cred (nil: the test's own).
func (a *Agent) CLIAs(cred *syscall.Credential, args ...string) Result {
	a.t.Helper()
	return a.run(cred, a.Dir, a.callTimeout(), args...)
}

// CLIIn runs the CLI in folder dir (for commands that look for
// ./deployd.toml).
func (a *Agent) CLIIn(dir string, args ...string) Result {
	a.t.Helper()
	return a.run(nil, dir, a.callTimeout(), args...)
}

// CLIWithin runs the CLI with its own deadline d.
func (a *Agent) CLIWithin(d time.Duration, args ...string) Result {
	a.t.Helper()
	return a.run(nil, a.Dir, d, args...)
}

// run runs the CLI against this agent within d; a missed deadline is Stuck.
func (a *Agent) run(cred *syscall.Credential, dir string, d time.Duration, args ...string) Result {
	a.t.Helper()
	ctx, cancel := a.Ctx(d)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bins.Deployd, args...)
	cmd.Dir = dir
	cmd.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	if ctx.Err() != nil {
		a.Stuck(fmt.Sprintf("deployd %s (stdout %q, stderr %q)", strings.Join(args, " "), out.String(), errb.String()), ctx.Err())
	}
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		a.t.Fatalf("run deployd %v: %v", args, err)
	}
	return r
}

// CleanEnv is the environment the tests give deployd and its workers: PATH,
// HOME and TMPDIR of the caller, the stress knobs .ci/stress sets (fault
// timings shifted on purpose), then extra — nothing else, so a variable of
// the caller's (DEPLOYD_LOG_FORMAT=json, NOTIFY_SOCKET, LISTEN_FDS under
// systemd, DEPLOYD_SOCKET) cannot change what the tests check. A test's own
// value in extra wins (exec keeps the last of a name).
func CleanEnv(extra ...string) []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", failpoint.EnvSignalDelay, failpoint.EnvHandoffHold} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, extra...)
}

// PIDs returns the pids of app's workers, by slot.
func PIDs(app api.App) map[int]int {
	m := map[int]int{}
	for _, w := range app.Workers {
		m[w.Slot] = w.PID
	}
	return m
}

// Alive reports whether pid exists (and is not a zombie).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
