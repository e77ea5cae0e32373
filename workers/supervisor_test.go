package workers

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestStartReadyModes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		helper string
		ready  ReadyPolicy
		n      int
	}{
		{"notify", "serve-ready", ReadyPolicy{Mode: ReadyNotify}, 2},
		{"notify-from-child", "ready-from-child", ReadyPolicy{Mode: ReadyNotify}, 1},
		{"node-ipc", "node-ipc-ready", ReadyPolicy{Mode: ReadyNodeIPC}, 2},
		{"log", "log-ready", ReadyPolicy{Mode: ReadyLog, Regex: regexp.MustCompile(`listening on fd \d`)}, 1},
		{"delay", "never-ready", ReadyPolicy{Mode: ReadyDelay, Delay: 50 * time.Millisecond}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := testSpec(t, newListener(t), tc.helper, tc.n)
			spec.Ready = tc.ready
			s := newSupervisor(t, spec)
			mustStart(t, s)

			st := s.Status()
			if st.State != AppRunning || st.Instances != tc.n || st.Release != "v1" {
				t.Errorf("status: state %s, instances %d, release %q", st.State, st.Instances, st.Release)
			}
			if len(st.Workers) != tc.n {
				t.Fatalf("%d workers, want %d: %+v", len(st.Workers), tc.n, st.Workers)
			}
			for i, w := range st.Workers {
				if w.Slot != i || w.State != Ready || w.PID <= 0 || w.Generation != 1 || w.ReadyAfter <= 0 {
					t.Errorf("worker %d: %+v", i, w)
				}
			}
			if tc.n > 1 && st.Workers[0].PID == st.Workers[1].PID {
				t.Error("both slots run the same pid")
			}
			if tc.ready.Mode == ReadyDelay && st.Workers[0].ReadyAfter < tc.ready.Delay {
				t.Errorf("ready after %s, before the delay %s", st.Workers[0].ReadyAfter, tc.ready.Delay)
			}
			if tc.helper == "serve-ready" {
				for i, w := range currentWorkers(s) {
					want := fmt.Sprintf("app web worker %d release v1 pid %d listen_pid %d fds 1", i, w.PID, w.PID)
					waitFor(t, "the contract line", func() bool { return slices.Contains(w.LastLines(), want) })
					if got := st.Workers[i].Status; got != "serving "+strconv.Itoa(i) {
						t.Errorf("worker %d STATUS = %q", i, got)
					}
				}
			}

			ws := currentWorkers(s)
			s.Stop()
			for i, w := range ws {
				if !isClosed(w.Done()) || w.State() != Exited {
					t.Errorf("worker %d still running after Stop", i)
				}
				// A delay-ready helper may not have set up its SIGTERM
				// handler yet; the others have before they report ready.
				if exitCode(w) != 0 && (tc.ready.Mode != ReadyDelay || w.ExitDescription() != "signal: terminated") {
					t.Errorf("worker %d: %s, want a clean exit on SIGTERM; output %q", i, w.ExitDescription(), w.LastLines())
				}
			}
			if st := s.Status(); st.State != AppStopped || len(st.Workers) != 0 {
				t.Errorf("after Stop: state %s, %d workers", st.State, len(st.Workers))
			}
		})
	}
}

func TestStartNotReady(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "never-ready", 1)
	spec.ReadyTimeout = 200 * time.Millisecond
	s := newSupervisor(t, spec)
	t0 := time.Now()
	err := s.Start()
	var nr *NotReadyError
	if !errors.As(err, &nr) || nr.Exited || nr.Timeout != spec.ReadyTimeout {
		t.Fatalf("Start = %v, want a NotReadyError after ready_timeout", err)
	}
	if d := time.Since(t0); d < spec.ReadyTimeout {
		t.Errorf("Start gave up after %s, before ready_timeout %s", d, spec.ReadyTimeout)
	}
	if !strings.Contains(err.Error(), "ready_timeout 200ms") {
		t.Errorf("error %q does not name the timeout", err)
	}
	// The worker runs on: readiness may still come.
	if st := s.Status(); len(st.Workers) != 1 || st.Workers[0].State != Starting {
		t.Errorf("status after a timeout: %+v", st.Workers)
	}
}

func TestCrashRestartsSlot(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 2))
	mustStart(t, s)
	old := currentWorkers(s)
	if err := syscall.Kill(old[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitChan(t, "the killed worker to be reaped", old[0].Done())
	waitFor(t, "slot 0 to be restarted", func() bool {
		w := currentWorkers(s)[0]
		return w != nil && w != old[0]
	})
	nw := currentWorkers(s)[0]
	waitChan(t, "the restarted worker to be ready", nw.Ready())

	st := s.Status()
	if len(st.Workers) != 2 {
		t.Fatalf("workers: %+v", st.Workers)
	}
	w0, w1 := st.Workers[0], st.Workers[1]
	if w0.PID == old[0].PID || w0.PID != nw.PID || w0.Restarts != 1 || w0.State != Ready {
		t.Errorf("slot 0 after a crash: %+v (old pid %d)", w0, old[0].PID)
	}
	if w1.PID != old[1].PID || w1.Restarts != 0 {
		t.Errorf("slot 1 was disturbed: %+v (pid was %d)", w1, old[1].PID)
	}
	if st.Restarts != 1 || st.State != AppRunning {
		t.Errorf("app: restarts %d, state %s", st.Restarts, st.State)
	}
	want := fmt.Sprintf("worker 0 (pid %d): signal: killed", old[0].PID)
	if st.LastExit != want {
		t.Errorf("LastExit = %q, want %q", st.LastExit, want)
	}
}

func TestCrashLoopErrorsThenRestart(t *testing.T) {
	t.Parallel()
	l := newListener(t)
	spec := testSpec(t, l, "exit-now", 1)
	spec.Restart.MaxRestarts = 2
	s := newSupervisor(t, spec)
	err := s.Start()
	var nr *NotReadyError
	if !errors.As(err, &nr) || !nr.Exited || exitCode(nr.Worker) != 3 {
		t.Fatalf("Start = %v, want a NotReadyError for a worker that exited 3", err)
	}
	waitFor(t, "the app to be errored", func() bool { return s.Status().State == AppErrored })

	st := s.Status()
	if !strings.Contains(st.LastExit, "exit status 3") || !strings.HasPrefix(st.LastExit, "worker 0 (pid ") {
		t.Errorf("LastExit = %q, want the exit status", st.LastExit)
	}
	if !slices.Contains(st.LastLines, "helper: cannot load config: boom") {
		t.Errorf("LastLines = %q, want the worker's output", st.LastLines)
	}
	if st.Restarts != spec.Restart.MaxRestarts {
		t.Errorf("restarts = %d, want max_restarts %d", st.Restarts, spec.Restart.MaxRestarts)
	}
	if w := currentWorkers(s)[0]; w == nil || !isClosed(w.Done()) {
		t.Error("an errored app has a running worker")
	}

	// Restart with a fixed release clears the errored state.
	good := nextSpec(spec, "serve-ready")
	if err := s.Restart(good); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	st = s.Status()
	if st.State != AppRunning || st.Release != good.Release || st.Restarts != 0 {
		t.Errorf("after Restart: state %s, release %s, restarts %d", st.State, st.Release, st.Restarts)
	}
	if len(st.Workers) != 1 || st.Workers[0].State != Ready || st.Workers[0].Generation != good.Generation {
		t.Errorf("after Restart: %+v", st.Workers)
	}
}

func TestRestartReplacesWorkers(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 2))
	mustStart(t, s)
	old := currentWorkers(s)
	if err := s.Restart(nil); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	for i, w := range old {
		if !isClosed(w.Done()) || exitCode(w) != 0 {
			t.Errorf("old worker %d: %s", i, w.ExitDescription())
		}
	}
	st := s.Status()
	if st.State != AppRunning || len(st.Workers) != 2 || st.Release != "v1" {
		t.Fatalf("after Restart: %+v", st)
	}
	for i, w := range st.Workers {
		if w.PID == old[i].PID || w.State != Ready {
			t.Errorf("slot %d after Restart: %+v", i, w)
		}
	}
}

func TestStopKillsGroupAfterTimeout(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "ignore-term", 1)
	spec.Env = append(spec.Env, "GRANDCHILD=1")
	spec.StopTimeout = 300 * time.Millisecond
	s := newSupervisor(t, spec)
	mustStart(t, s)
	w := currentWorkers(s)[0]
	var grandchild int
	waitFor(t, "the grandchild's pid", func() bool {
		for _, line := range w.LastLines() {
			if n, err := fmt.Sscanf(line, "grandchild %d", &grandchild); n == 1 && err == nil {
				return true
			}
		}
		return false
	})

	t0 := time.Now()
	s.Stop()
	d := time.Since(t0)
	if d < spec.StopTimeout || d > spec.StopTimeout+5*time.Second {
		t.Errorf("Stop took %s, want stop_timeout %s and then a kill", d, spec.StopTimeout)
	}
	if got := w.ExitDescription(); got != "signal: killed" {
		t.Errorf("worker ended with %q, want signal: killed", got)
	}
	waitFor(t, "the grandchild to be killed with the group", func() bool { return processGone(grandchild) })

	// Stop is safe to call again, also concurrently.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Stop()
		}()
	}
	wg.Wait()
	if st := s.Status(); st.State != AppStopped {
		t.Errorf("state %s after Stop", st.State)
	}
}

func TestStopTwiceAndAfterStop(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	w := currentWorkers(s)[0]
	s.Stop()
	s.Stop()
	if !isClosed(w.Done()) || exitCode(w) != 0 {
		t.Errorf("worker after Stop: %s", w.ExitDescription())
	}
	if err := s.Start(); !errors.Is(err, ErrCanceled) {
		t.Errorf("Start after Stop = %v, want ErrCanceled", err)
	}
	if err := s.Reload(nextSpec(spec, "serve-ready"), Rolling, nil); !errors.Is(err, ErrCanceled) {
		t.Errorf("Reload after Stop = %v, want ErrCanceled", err)
	}
	if st := s.Status(); st.State != AppStopped || len(st.Workers) != 0 {
		t.Errorf("after Stop: %+v", st)
	}
}

// A supervisor that was never started stops at once.
func TestStopUnstarted(t *testing.T) {
	t.Parallel()
	s := New(Options{App: "web", Shim: testBinary(t)}, testSpec(t, newListener(t), "serve-ready", 1))
	s.Stop()
	s.Stop()
	if st := s.Status(); st.State != AppStopped {
		t.Errorf("state %s", st.State)
	}
}

func TestStartMissingApp(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	spec.Argv = []string{"/nonexistent/deployd-test-app"}
	spec.Restart.MaxRestarts = 0
	s := newSupervisor(t, spec)
	err := s.Start()
	var nr *NotReadyError
	if !errors.As(err, &nr) || exitCode(nr.Worker) != 127 {
		t.Fatalf("Start = %v, want a worker that exited 127", err)
	}
	waitFor(t, "the app to be errored", func() bool { return s.Status().State == AppErrored })
	st := s.Status()
	if !strings.Contains(st.LastExit, "exit status 127") {
		t.Errorf("LastExit = %q", st.LastExit)
	}
	if !slices.ContainsFunc(st.LastLines, func(l string) bool { return strings.Contains(l, "/nonexistent/deployd-test-app") }) {
		t.Errorf("LastLines = %q, want the shim's explanation", st.LastLines)
	}
}
