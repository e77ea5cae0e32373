package workers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
)

// helperEnv selects a helper behaviour when the test binary runs as a worker.
const helperEnv = "DEPLOYD_WORKERS_TEST_HELPER"

// noRaceExitSleep keeps a race-enabled helper from sleeping 1 s at exit
// (the race runtime's atexit_sleep_ms default).
const noRaceExitSleep = "GORACE=atexit_sleep_ms=0"

// helperLifetime bounds every helper process, so that a failed test cannot
// leave one behind for long; HELPER_LIFETIME in a helper's environment
// sets another bound.
const helperLifetime = 20 * time.Second

// helpers are the behaviours of the test binary when it runs as a worker
// (the os/exec tests' helper-process habit). Each returns the exit code.
var helpers = map[string]func() int{
	"serve-ready": serveReady,
	"exit-now":    exitNow,
	// ticker is ready, then prints "tick N" (and sends STATUS=tick N) every
	// 5 ms until SIGTERM.
	"ticker": func() int {
		term := notifyTerm()
		if err := sdNotify("READY=1"); err != nil {
			return 5
		}
		for n := 1; ; n++ {
			select {
			case <-term:
				return 0
			case <-time.After(5 * time.Millisecond):
				fmt.Printf("tick %d\n", n)
				_ = sdNotify(fmt.Sprintf("STATUS=tick %d", n))
			}
		}
	},
	// serve-ready-slot-0 is serve-ready in slot 0 and exit-now elsewhere.
	"serve-ready-slot-0": func() int {
		if os.Getenv("DEPLOYD_WORKER") == "0" {
			return serveReady()
		}
		return exitNow()
	},
	// never-ready runs until SIGTERM without reporting readiness.
	"never-ready": func() int {
		term := notifyTerm()
		fmt.Println("helper: starting forever")
		<-term
		return 0
	},
	// ignore-term is ready but ignores SIGTERM; with GRANDCHILD=1 it
	// first starts a child in its process group that hangs too.
	"ignore-term": func() int {
		signal.Ignore(syscall.SIGTERM)
		if os.Getenv("GRANDCHILD") != "" {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), helperEnv+"=hang")
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			if err := cmd.Start(); err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 5
			}
			fmt.Printf("grandchild %d\n", cmd.Process.Pid)
		}
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		select {} // until SIGKILL (or helperLifetime)
	},
	"hang": func() int {
		select {}
	},
	// ready-then-exit is ready, then exits 0 after EXIT_AFTER, as a release
	// that dies just after start does. With EXIT_SLOT set, only that slot
	// exits; the others serve, ready after READY_AFTER.
	"ready-then-exit": func() int {
		term := notifyTerm()
		exits := os.Getenv("EXIT_SLOT") == "" || os.Getenv("EXIT_SLOT") == os.Getenv("DEPLOYD_WORKER")
		if d, err := time.ParseDuration(os.Getenv("READY_AFTER")); err == nil && !exits {
			time.Sleep(d)
		}
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		if !exits {
			<-term
			return 0
		}
		d, _ := time.ParseDuration(os.Getenv("EXIT_AFTER"))
		time.Sleep(d)
		fmt.Println("helper: ready, and done")
		return 0
	},
	// log-ready prints the line the log:REGEX readiness waits for.
	"log-ready": func() int {
		term := notifyTerm()
		fmt.Println("helper: server listening on fd 3")
		<-term
		return 0
	},
	// node-ipc-ready does what Node's process.send('ready') does.
	"node-ipc-ready": func() int {
		term := notifyTerm()
		fd, err := strconv.Atoi(os.Getenv(handoff.EnvNodeChannelFD))
		if err != nil || os.Getenv("NODE_CHANNEL_SERIALIZATION_MODE") != "json" {
			fmt.Fprintln(os.Stderr, "helper: no node-ipc channel:", err)
			return 4
		}
		if _, err := unix.Write(fd, []byte("\"ready\"\n")); err != nil {
			fmt.Fprintln(os.Stderr, "helper: node-ipc write:", err)
			return 5
		}
		<-term
		return 0
	},
	// ready-from-child lets a short-lived child of its own send READY=1.
	"ready-from-child": func() int {
		term := notifyTerm()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=notify-once")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "helper: child: %v: %s\n", err, out)
			return 5
		}
		fmt.Printf("helper: child %d sent READY=1\n", cmd.Process.Pid)
		<-term
		return 0
	},
	// burn is ready, then spins the CPU until SIGTERM.
	"burn": func() int {
		term := notifyTerm()
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		for x := 0; ; x++ {
			select {
			case <-term:
				return 0
			default:
			}
			if x < 0 {
				return 6
			}
		}
	},
	// first-only is serve-ready the first time it runs in a slot (it
	// leaves a marker in $MARKER_DIR); later it exits 3, or with
	// THEN=hang runs without getting ready.
	"first-only": func() int {
		marker := filepath.Join(os.Getenv("MARKER_DIR"), "slot"+os.Getenv("DEPLOYD_WORKER"))
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			f.Close()
			return serveReady()
		}
		if os.Getenv("THEN") == "hang" {
			term := notifyTerm()
			fmt.Println("helper: not the first; never ready")
			<-term
			return 0
		}
		return exitNow()
	},
	// slow-drain is ready and serves; on SIGTERM it stops accepting (closes
	// its listening fds) and goes on for DRAIN_FOR (a long drain: streams
	// still open), then exits DRAIN_EXIT (0 if unset). With DRAIN_FOR past
	// the stop timeout it is killed first.
	"slow-drain": func() int {
		term := notifyTerm()
		drain, _ := time.ParseDuration(os.Getenv("DRAIN_FOR"))
		code, _ := strconv.Atoi(os.Getenv("DRAIN_EXIT"))
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		<-term
		n, _ := strconv.Atoi(os.Getenv(handoff.EnvListenFDs))
		for fd := 3; fd < 3+n; fd++ {
			unix.Close(fd)
		}
		fmt.Println("helper: draining for", drain)
		time.Sleep(drain)
		return code
	},
	"notify-once": func() int {
		if err := sdNotify("READY=1\nSTATUS=from a child"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		return 0
	},
}

// serveReady checks the worker contract, sends READY=1 and serves until
// SIGTERM, then exits 0.
func serveReady() int {
	term := notifyTerm()
	if err := checkContract(); err != nil {
		fmt.Fprintln(os.Stderr, "helper: worker contract broken:", err)
		return 4
	}
	fmt.Printf("app %s worker %s release %s pid %d listen_pid %s fds %s\n",
		os.Getenv("DEPLOYD_APP"), os.Getenv("DEPLOYD_WORKER"), os.Getenv("DEPLOYD_RELEASE"),
		os.Getpid(), os.Getenv(handoff.EnvListenPID), os.Getenv(handoff.EnvListenFDs))
	if err := sdNotify("READY=1\nSTATUS=serving " + os.Getenv("DEPLOYD_WORKER")); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 5
	}
	<-term
	return 0
}

// exitNow fails at once, as an app with a broken config does.
func exitNow() int {
	fmt.Fprintln(os.Stderr, "helper: cannot load config: boom")
	return 3
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == handoff.ShimArg {
		os.Exit(handoff.RunShim(os.Args[2:]))
	}
	if name := os.Getenv(helperEnv); name != "" {
		h, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
			os.Exit(2)
		}
		lifetime := helperLifetime
		if d, err := time.ParseDuration(os.Getenv("HELPER_LIFETIME")); err == nil {
			lifetime = d
		}
		time.AfterFunc(lifetime, func() { os.Exit(99) })
		os.Exit(h())
	}
	goleak.VerifyTestMain(m)
}

func notifyTerm() <-chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	return c
}

func sdNotify(msg string) error {
	addr := os.Getenv(handoff.EnvNotifySocket)
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	_, err = c.Write([]byte(msg))
	return err
}

// checkContract checks what the worker contract promises a worker.
func checkContract() error {
	n, err := strconv.Atoi(os.Getenv(handoff.EnvListenFDs))
	if err != nil || n < 1 {
		return fmt.Errorf("LISTEN_FDS=%q", os.Getenv(handoff.EnvListenFDs))
	}
	if pid := os.Getenv(handoff.EnvListenPID); pid != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("LISTEN_PID=%s, pid %d", pid, os.Getpid())
	}
	for fd := 3; fd < 3+n; fd++ {
		if _, err := unix.Getsockname(fd); err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
			return fmt.Errorf("fd %d is not a listening socket (%v)", fd, err)
		}
	}
	if pgid, _ := unix.Getpgid(0); pgid != os.Getpid() {
		return fmt.Errorf("process group %d, pid %d", pgid, os.Getpid())
	}
	return nil
}

// --- test side ---

// Timeouts of the test specs. Nothing waits for them when the code under
// test works (helpers get ready and exit on SIGTERM in milliseconds), so
// they leave room for a loaded machine; tests of the timeouts themselves
// set short ones. Waits for conditions are bounded by waitTimeout.
const (
	readyTimeout = 5 * time.Second
	stopTimeout  = 3 * time.Second
	waitTimeout  = 15 * time.Second
)

var (
	exeOnce sync.Once
	exePath string
	exeErr  error
)

// testBinary is the path of this test binary: the shim and every worker.
func testBinary(t testing.TB) string {
	t.Helper()
	exeOnce.Do(func() { exePath, exeErr = os.Executable() })
	if exeErr != nil {
		t.Fatal(exeErr)
	}
	return exePath
}

// newListener opens a listener for the workers and closes it at the end.
func newListener(t testing.TB) *handoff.Listener {
	t.Helper()
	l, err := handoff.Open("tcp", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// testSpec is a spec of n workers running helper, ready by sd_notify.
func testSpec(t testing.TB, l *handoff.Listener, helper string, n int) *Spec {
	t.Helper()
	return &Spec{
		Release:      "v1",
		Generation:   1,
		Argv:         []string{testBinary(t)},
		Env:          []string{helperEnv + "=" + helper, noRaceExitSleep},
		Listeners:    []handoff.Bound{{Listener: l, Name: "http"}},
		Instances:    n,
		Ready:        ReadyPolicy{Mode: ReadyNotify},
		ReadyTimeout: readyTimeout,
		StopSignal:   syscall.SIGTERM,
		StopTimeout:  stopTimeout,
		Restart: RestartPolicy{
			Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond,
			MaxRestarts: 5, Window: time.Minute, StableAfter: 10 * time.Second,
		},
		MaxSurge: 1,
	}
}

// nextSpec returns a copy of spec for the next release running helper.
func nextSpec(spec *Spec, helper string) *Spec {
	n := *spec
	n.Generation++
	n.Release = "v" + strconv.Itoa(n.Generation)
	n.Env = []string{helperEnv + "=" + helper, noRaceExitSleep}
	return &n
}

// newSupervisor returns a supervisor for spec, stopped when the test ends.
func newSupervisor(t testing.TB, spec *Spec) *Supervisor {
	t.Helper()
	s := New(Options{App: "web", Shim: testBinary(t)}, spec)
	t.Cleanup(s.Stop)
	return s
}

// mustStart starts s and fails the test if a worker is not ready.
func mustStart(t testing.TB, s *Supervisor) {
	t.Helper()
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

// currentWorkers returns the current worker of every slot.
func currentWorkers(s *Supervisor) []*Worker {
	var ws []*Worker
	s.read(func(st *state) {
		ws = make([]*Worker, len(st.slots))
		for i, sl := range st.slots {
			ws[i] = sl.cur
		}
	})
	return ws
}

// exitCode is w's exit code, or -1 when killed by a signal or still running.
func exitCode(w *Worker) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exitState == nil {
		return -1
	}
	return w.exitState.ExitCode()
}

func pids(ws []*Worker) []int {
	var out []int
	for _, w := range ws {
		if w == nil {
			out = append(out, 0)
			continue
		}
		out = append(out, w.PID)
	}
	return out
}

// waitFor polls cond until it holds; it fails the test after waitTimeout.
// Used where the code under test offers no channel to wait on.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// waitChan waits until ch is closed, failing the test after waitTimeout.
func waitChan(t testing.TB, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// processGone reports whether pid has exited (no process, or a zombie nobody
// reaped: orphans go to a pid 1 that may not reap in a container).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// recorder collects reload events. It takes no lock: Reload documents that
// progress is not called concurrently.
type recorder struct{ events []Event }

func (r *recorder) add(e Event) { r.events = append(r.events, e) }

// steps returns the events as "type/slot" strings.
func (r *recorder) steps() []string {
	var out []string
	for _, e := range r.events {
		out = append(out, string(e.Type)+"/"+strconv.Itoa(e.Slot))
	}
	return out
}

// forSlot returns the events of one slot, in order.
func (r *recorder) forSlot(slot int) []Event {
	return slices.DeleteFunc(slices.Clone(r.events), func(e Event) bool { return e.Slot != slot })
}
