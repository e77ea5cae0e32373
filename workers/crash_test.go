package workers

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRestartDelay(t *testing.T) {
	p := RestartPolicy{Backoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond, StableAfter: time.Second}
	now := time.Now()
	worker := func(up time.Duration, ready bool) *Worker {
		w := &Worker{Started: now.Add(-up), ready: make(chan struct{})}
		if ready {
			close(w.ready)
		}
		return w
	}
	sl := &slot{backoff: p.Backoff}

	// A crash loop (never ready, or ready but up less than stable_after)
	// waits the backoff, jittered, and doubles it up to max_backoff.
	for i, w := range []*Worker{worker(0, false), worker(500*time.Millisecond, true), worker(time.Hour, false)} {
		before := sl.backoff
		d := restartDelay(sl, w, p, now)
		if d < before*8/10 || d > min(before*12/10, p.MaxBackoff) {
			t.Errorf("crash loop %d: delay %v for backoff %v", i, d, before)
		}
		if want := min(before*2, p.MaxBackoff); sl.backoff != want {
			t.Errorf("crash loop %d: backoff became %v, want %v", i, sl.backoff, want)
		}
	}
	// An isolated crash (ready and up stable_after) restarts at once and
	// resets the backoff.
	if d := restartDelay(sl, worker(p.StableAfter, true), p, now); d != 0 || sl.backoff != p.Backoff {
		t.Errorf("isolated crash: delay %v, backoff %v; want 0 and %v", d, sl.backoff, p.Backoff)
	}
}

func TestRestartDelayJitterCappedAtMaxBackoff(t *testing.T) {
	p := RestartPolicy{Backoff: 30 * time.Second, MaxBackoff: 30 * time.Second, StableAfter: time.Second}
	sl := &slot{backoff: p.MaxBackoff}
	w := &Worker{Started: time.Now(), ready: make(chan struct{})}
	for range 1000 {
		if d := restartDelay(sl, w, p, time.Now()); d > p.MaxBackoff {
			t.Fatalf("delay %v above max_backoff %v", d, p.MaxBackoff)
		}
	}
}

func TestRoundDuration(t *testing.T) {
	for in, want := range map[time.Duration]string{
		33219918522 * time.Nanosecond: "33.2s",
		1234567890 * time.Nanosecond:  "1.235s",
		0:                             "0s",
	} {
		if got := roundDuration(in).String(); got != want {
			t.Errorf("roundDuration(%v) = %s, want %s", in, got, want)
		}
	}
}

// An isolated crash restarts at once: with a one-hour backoff, the slot
// is back only if its restart did not wait.
func TestIsolatedCrashRestartsAtOnce(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	spec.Restart.Backoff, spec.Restart.MaxBackoff = time.Hour, time.Hour
	spec.Restart.StableAfter = 50 * time.Millisecond
	s := newSupervisor(t, spec)
	mustStart(t, s)
	for i := range 3 { // each crash after stable_after restarts at once, not after a growing delay
		old := currentWorkers(s)[0]
		waitChan(t, "the worker to be ready", old.Ready())
		waitFor(t, "the worker to be up stable_after", func() bool {
			return time.Since(old.Started) >= spec.Restart.StableAfter
		})
		killed := time.Now()
		if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "slot 0 to be restarted", func() bool {
			w := currentWorkers(s)[0]
			return w != nil && w != old
		})
		nw := currentWorkers(s)[0]
		waitChan(t, "the restarted worker to be ready", nw.Ready())
		t.Logf("crash %d: replacement ready %v after SIGKILL", i, time.Since(killed).Round(time.Millisecond))
	}
	if st := s.Status(); st.Restarts != 3 || st.State != AppRunning {
		t.Errorf("restarts %d, state %s; want 3, running", st.Restarts, st.State)
	}
}

func TestNotReadyNodeIPCSuggestsProcessSend(t *testing.T) {
	w := &Worker{Slot: 1, PID: 42, spec: &Spec{Ready: ReadyPolicy{Mode: ReadyNodeIPC}}}
	got := (&NotReadyError{Worker: w, Timeout: 5 * time.Second}).Error()
	want := "worker 1 (pid 42) was not ready within ready_timeout 5s; with ready = \"node-ipc\" the app must call process.send('ready') once it listens"
	if !strings.HasPrefix(got, want) {
		t.Errorf("NotReadyError = %q, want it to start with %q", got, want)
	}
}
