package workers

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
)

func init() {
	helpers["health-serve"] = healthServe
}

// healthServe sends READY=1 at once (which ready = "http:..." must not
// count), then serves GET /healthz on the listener named deployd-health in
// LISTEN_FDNAMES: 503 until HEALTH_OK_AFTER has passed, then 200, and no
// answer at all while the file $SICK_DIR/<pid> exists.
func healthServe() int {
	term := notifyTerm()
	names := strings.Split(os.Getenv(handoff.EnvListenFDNames), ":")
	n, _ := strconv.Atoi(os.Getenv(handoff.EnvListenFDs))
	if n != len(names) || names[n-1] != handoff.HealthFDName {
		fmt.Fprintf(os.Stderr, "helper: LISTEN_FDS=%d LISTEN_FDNAMES=%q: no %s last\n", n, names, handoff.HealthFDName)
		return 4
	}
	fd := 3 + n - 1
	if sa, err := unix.Getsockname(fd); err != nil {
		return 4
	} else if _, ok := sa.(*unix.SockaddrUnix); !ok {
		fmt.Fprintf(os.Stderr, "helper: fd %d is a %T, not a unix socket\n", fd, sa)
		return 4
	}
	l, err := net.FileListener(os.NewFile(uintptr(fd), "health"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 4
	}
	okAfter, _ := time.ParseDuration(os.Getenv("HEALTH_OK_AFTER"))
	start := time.Now()
	sick := filepath.Join(os.Getenv("SICK_DIR"), strconv.Itoa(os.Getpid()))
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat(sick); err == nil && os.Getenv("SICK_DIR") != "" {
			<-r.Context().Done() // hung: never answers
			return
		}
		if r.URL.Path != "/healthz" || time.Since(start) < okAfter {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	if err := sdNotify("READY=1"); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 5
	}
	<-term
	return 0
}

func healthSpec(t *testing.T, n int, env ...string) *Spec {
	spec := testSpec(t, newListener(t), "health-serve", n)
	spec.Env = append(spec.Env, env...)
	spec.Ready = ReadyPolicy{Mode: ReadyHTTP, Path: "/healthz"}
	return spec
}

// ready = "http:/healthz": a worker that sent READY=1 and serves, but whose
// health path does not answer 2xx yet, is not ready; it is once it does.
// Both with a path health socket (beside the notify socket) and an
// abstract one.
func TestHTTPReadyWaitsForHealthPath(t *testing.T) {
	t.Parallel()
	const okAfter = 400 * time.Millisecond
	for _, dir := range []string{"", "path"} {
		t.Run("notify-dir="+dir, func(t *testing.T) {
			t.Parallel()
			spec := healthSpec(t, 1, "HEALTH_OK_AFTER="+okAfter.String())
			opts := Options{App: "web", Shim: testBinary(t)}
			if dir != "" {
				opts.NotifyDir = shortTempDir(t)
			}
			s := New(opts, spec)
			t.Cleanup(s.Stop)
			mustStart(t, s)
			w := currentWorkers(s)[0]
			if got := w.ReadyAfter(); got < okAfter {
				t.Errorf("ready after %s: counted ready before its health path answered 2xx (after %s)", got, okAfter)
			}
			if dir != "" && !strings.HasPrefix(w.health.addr, opts.NotifyDir) {
				t.Errorf("health socket %s, want one in %s", w.health.addr, opts.NotifyDir)
			}
			if st := s.Status(); st.Workers[0].HealthError != "" {
				t.Errorf("status health error %q after ready, want none", st.Workers[0].HealthError)
			}
		})
	}
}

// A worker whose health path never answers 2xx is not ready: the error
// names the path and the last answer. The timeout leaves a loaded machine
// time to start the helper and answer one probe (700 ms did not, in a CI
// run beside other tests: the error then had no answer to name).
func TestHTTPReadyTimeoutSaysWhy(t *testing.T) {
	t.Parallel()
	spec := healthSpec(t, 1, "HEALTH_OK_AFTER=1h")
	spec.ReadyTimeout = 5 * time.Second
	s := newSupervisor(t, spec)
	err := s.Start()
	var nr *NotReadyError
	if !errors.As(err, &nr) || nr.Exited {
		t.Fatalf("Start: %v, want a ready_timeout NotReadyError", err)
	}
	for _, want := range []string{"503 Service Unavailable", `ready = "http:/healthz"`, handoff.HealthFDName} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// A worker whose health path stops answering is replaced after
// health.failures checks in a row, new one ready first; the other worker
// is untouched.
func TestLivenessReplacesHungWorker(t *testing.T) {
	t.Parallel()
	sick := t.TempDir()
	spec := healthSpec(t, 2, "SICK_DIR="+sick)
	spec.Health = &HealthPolicy{Path: "/healthz", Interval: 50 * time.Millisecond, Timeout: 100 * time.Millisecond, Failures: 3}
	s := newSupervisor(t, spec)
	mustStart(t, s)
	events, cancel := s.Subscribe()
	defer cancel()
	old := currentWorkers(s)
	if err := os.WriteFile(filepath.Join(sick, strconv.Itoa(old[0].PID)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rep := nextEvent(t, events, EventReplace)
	// The tick (every sampleInterval) acts on a run of at least 3.
	var run int
	if _, err := fmt.Sscanf(rep.Message, "health: %d failed checks in a row", &run); err != nil || run < 3 ||
		rep.Slot != 0 || rep.PID != old[0].PID || !strings.Contains(rep.Message, "no answer within 100ms") {
		t.Errorf("replace event %+v, want slot 0 pid %d for 3 failed health checks", rep, old[0].PID)
	}
	now := currentWorkers(s)
	if now[0].PID == old[0].PID || now[0].State() != Ready {
		t.Errorf("slot 0: pid %d state %s, want a new ready worker", now[0].PID, now[0].State())
	}
	if now[1].PID != old[1].PID {
		t.Errorf("slot 1: pid %d, want the healthy %d untouched", now[1].PID, old[1].PID)
	}
	waitChan(t, "the hung worker to exit", old[0].Done())
	waitDrained(t, s)
	st := s.Status()
	if st.Workers[0].HealthReplacements != 1 || st.Workers[1].HealthReplacements != 0 {
		t.Errorf("health replacements %d, %d; want 1, 0", st.Workers[0].HealthReplacements, st.Workers[1].HealthReplacements)
	}
	run, total := old[0].healthFailures()
	if run < 3 || total < 3 {
		t.Errorf("the replaced worker's failures %d (total %d), want at least 3", run, total)
	}
	// The app's count keeps the replaced worker's failures, beside those
	// of the running workers (healthy, but a loaded machine can make one
	// miss a check): between their totals read before and after it.
	totals := func() (n int) {
		for _, w := range now {
			_, t := w.healthFailures()
			n += t
		}
		return n
	}
	lo := total + totals()
	got := int(s.Counters().HealthCheckFailures)
	if hi := total + totals(); got < lo || got > hi {
		t.Errorf("Counters().HealthCheckFailures = %d after the replacement, want the replaced worker's %d and the running ones' (%d to %d in all)",
			got, total, lo, hi)
	}
}

// shortTempDir is a temp folder with a path short enough for socket
// addresses below it.
func shortTempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "dh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// With a health listener, NODE_CHANNEL_FD still names the node-ipc
// channel: the fd after the health listener.
func TestNodeIPCChannelFollowsHealthListener(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "node-ipc-ready", 1)
	spec.Ready = ReadyPolicy{Mode: ReadyNodeIPC}
	spec.Health = &HealthPolicy{Path: "/healthz", Interval: time.Hour, Timeout: time.Second, Failures: 3}
	s := newSupervisor(t, spec)
	mustStart(t, s)
	if w := currentWorkers(s)[0]; w.health.addr == "" {
		t.Error("the worker got no health socket")
	}
}
