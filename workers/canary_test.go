package workers

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"
)

// canaryEnds records the ends OnEnd hears.
type canaryEnds chan CanaryEnd

func (c canaryEnds) add(e CanaryEnd) { c <- e }

// next waits for the next end, failing the test after waitTimeout.
func (c canaryEnds) next(t *testing.T) CanaryEnd {
	t.Helper()
	select {
	case e := <-c:
		return e
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for the canary to end")
	}
	return CanaryEnd{}
}

// startCanary starts n workers of serve-ready and holds a canary of one
// worker of next (a helper, with env); it returns the old workers, the
// canary's spec and its ends.
func startCanary(t *testing.T, n int, next string, env []string, c Canary) (*Supervisor, []*Worker, *Spec, canaryEnds) {
	t.Helper()
	spec := testSpec(t, newListener(t), "serve-ready", n)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)
	spec2 := nextSpec(spec, next)
	spec2.Env = append(spec2.Env, env...)
	ends := make(canaryEnds, 4)
	c.OnEnd = ends.add
	if err := s.ReloadCanary(spec2, Rolling, c, nil); err != nil {
		t.Fatalf("ReloadCanary: %v", err)
	}
	return s, old, spec2, ends
}

// releases lists the release of each slot's current worker.
func releases(s *Supervisor) []string {
	var out []string
	for _, w := range currentWorkers(s) {
		out = append(out, w.Release)
	}
	return out
}

func TestCanaryHoldsThenPromotes(t *testing.T) {
	t.Parallel()
	s, old, spec2, ends := startCanary(t, 3, "serve-ready", nil, Canary{N: 1})
	held := currentWorkers(s)
	st := s.Status()
	if st.State != AppCanary || st.Canary == nil || !slices.Equal(st.Canary.Slots, []int{0}) ||
		st.Canary.Release != "v2" || st.Canary.Previous != "v1" || st.Busy != nil {
		t.Fatalf("during the hold: state %s, canary %+v, busy %v", st.State, st.Canary, st.Busy)
	}
	if got := releases(s); !slices.Equal(got, []string{"v2", "v1", "v1"}) {
		t.Fatalf("releases during the hold %v, want [v2 v1 v1]", got)
	}
	if held[1] != old[1] || held[2] != old[2] || held[0] == old[0] {
		t.Fatalf("the hold must replace slot 0 only: old %v, now %v", pids(old), pids(held))
	}
	// Every other operation is refused, naming the hold.
	refused := map[string]error{
		"reload":  s.Reload(nextSpec(spec2, "serve-ready"), Rolling, nil),
		"scale":   s.Scale(4, nil),
		"restart": s.Restart(nil),
		"pause":   s.Pause(),
		"canary":  s.ReloadCanary(nextSpec(spec2, "serve-ready"), Rolling, Canary{N: 1}, nil),
	}
	for what, err := range refused {
		var he *HoldError
		if !errors.As(err, &he) || !errors.Is(err, ErrBusy) || he.Release != "v2" || !slices.Equal(he.Slots, []int{0}) {
			t.Errorf("%s during the hold: %v, want a *HoldError of v2 on slot 0", what, err)
		}
	}
	if _, err := s.HandOver(); !errors.Is(err, ErrBusy) {
		t.Errorf("HandOver during the hold: %v, want refused", err)
	}

	end, err := s.Promote(nil)
	if err != nil || end.Outcome != CanaryPromoted || end.By != "promote" || end.Release != "v2" || end.Err != nil {
		t.Fatalf("Promote: %+v, %v", end, err)
	}
	if e := ends.next(t); e.Outcome != CanaryPromoted {
		t.Errorf("OnEnd heard %+v", e)
	}
	checkReplaced(t, s, old, spec2)
	if now := currentWorkers(s); now[0] != held[0] {
		t.Errorf("promote replaced the canary itself: pid %d, then %d", held[0].PID, now[0].PID)
	}
	st = s.Status()
	if st.Canary != nil || st.LastCanary == nil || st.LastCanary.Outcome != CanaryPromoted {
		t.Errorf("after promote: canary %+v, last %+v", st.Canary, st.LastCanary)
	}
	var nc *NoCanaryError
	if _, err := s.Promote(nil); !errors.As(err, &nc) || nc.Last == nil || nc.Last.Outcome != CanaryPromoted {
		t.Errorf("second Promote: %v, want a *NoCanaryError naming the promote", err)
	}
	if err := s.Scale(2, nil); err != nil {
		t.Errorf("Scale after the hold: %v", err)
	}
	if _, err := s.Abort(nil); !errors.As(err, &nc) || nc.Last != nil {
		t.Errorf("Abort after another operation: %v, want a *NoCanaryError without a last canary", err)
	}
}

func TestCanaryAbortRestoresOldRelease(t *testing.T) {
	t.Parallel()
	s, old, _, ends := startCanary(t, 3, "serve-ready", nil, Canary{N: 2})
	canaries := currentWorkers(s)[:2]
	end, err := s.Abort(nil)
	if err != nil || end.Outcome != CanaryAborted || end.By != "abort" || end.Err != nil {
		t.Fatalf("Abort: %+v, %v", end, err)
	}
	ends.next(t)
	waitDrained(t, s)
	st := s.Status()
	if st.State != AppRunning || st.Release != "v1" || s.Spec().Release != "v1" || st.Canary != nil {
		t.Fatalf("after abort: state %s release %s canary %+v", st.State, st.Release, st.Canary)
	}
	now := currentWorkers(s)
	if got := releases(s); !slices.Equal(got, []string{"v1", "v1", "v1"}) {
		t.Fatalf("releases after abort %v", got)
	}
	if now[2] != old[2] {
		t.Errorf("abort touched slot 2: pid %d, then %d", old[2].PID, now[2].PID)
	}
	for i, w := range canaries {
		if !isClosed(w.Done()) || exitCode(w) != 0 || now[i].State() != Ready {
			t.Errorf("canary %d (pid %d): %s; slot now %s", i, w.PID, w.ExitDescription(), now[i].State())
		}
	}
}

// A canary that crashes during the hold aborts it by itself: its slot goes
// back to the old release (no restart of the new one), the others stay.
func TestCanaryCrashAbortsByItself(t *testing.T) {
	t.Parallel()
	s, old, _, ends := startCanary(t, 2, "ready-then-exit",
		[]string{"EXIT_SLOT=0", "EXIT_AFTER=500ms"}, Canary{N: 1})
	canary := currentWorkers(s)[0]
	end := ends.next(t)
	if end.Outcome != CanaryAborted || end.By != "crash" || end.Err != nil {
		t.Fatalf("end %+v, want aborted by the crash", end)
	}
	if !isClosed(canary.Done()) {
		t.Fatal("the canary runs still")
	}
	waitFor(t, "the abort to end", func() bool { return s.Status().State == AppRunning })
	if got := releases(s); !slices.Equal(got, []string{"v1", "v1"}) {
		t.Fatalf("releases after the crash %v, want [v1 v1]", got)
	}
	if now := currentWorkers(s); now[1] != old[1] || now[0].State() != Ready {
		t.Errorf("after the abort: slot 1 pid %d (was %d), slot 0 %s", now[1].PID, old[1].PID, now[0].State())
	}
	if st := s.Status(); st.LastCanary == nil || st.LastCanary.By != "crash" || st.Restarts != 0 {
		t.Errorf("status after the abort: last %+v, restarts %d (the new release must not restart)", st.LastCanary, st.Restarts)
	}
}

func TestCanaryTimeoutEndsHold(t *testing.T) {
	t.Parallel()
	for _, action := range []CanaryAction{CanaryPromote, CanaryAbort} {
		t.Run(string(action), func(t *testing.T) {
			t.Parallel()
			s, _, _, ends := startCanary(t, 2, "serve-ready", nil,
				Canary{N: 1, Timeout: 300 * time.Millisecond, Action: action})
			if st := s.Status(); st.Canary == nil || st.Canary.Timeout != 300*time.Millisecond || st.Canary.Action != action {
				t.Fatalf("hold %+v", st.Canary)
			}
			end := ends.next(t)
			want := map[CanaryAction]CanaryOutcome{CanaryPromote: CanaryPromoted, CanaryAbort: CanaryAborted}[action]
			if end.Outcome != want || end.By != "canary_timeout" || end.Held < 300*time.Millisecond {
				t.Fatalf("end %+v, want %s by canary_timeout after 300ms", end, want)
			}
			waitFor(t, "the end to finish", func() bool { return s.Status().State == AppRunning })
			rel := map[CanaryAction]string{CanaryPromote: "v2", CanaryAbort: "v1"}[action]
			if got := releases(s); !slices.Equal(got, []string{rel, rel}) {
				t.Errorf("releases %v, want %s everywhere", got, rel)
			}
		})
	}
}

// A canary over max_memory aborts the hold instead of being replaced.
func TestCanaryOverMemoryAborts(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	spec2 := nextSpec(spec, "serve-ready")
	spec2.MaxMemory = 1 // every worker of v2 is over it
	ends := make(canaryEnds, 1)
	if err := s.ReloadCanary(spec2, Rolling, Canary{N: 1, OnEnd: ends.add}, nil); err != nil {
		t.Fatal(err)
	}
	end := ends.next(t)
	if end.Outcome != CanaryAborted || end.By != "max_memory" {
		t.Fatalf("end %+v, want aborted by max_memory", end)
	}
	waitFor(t, "the abort to end", func() bool { return s.Status().State == AppRunning })
	waitDrained(t, s)
	st := s.Status()
	for _, w := range st.Workers {
		if w.Release != "v1" || w.MemoryReplacements != 0 {
			t.Errorf("worker %+v, want v1 and no replacement", w)
		}
	}
}

// A promote that fails rolls every slot back, the canaries too.
func TestCanaryPromoteFailureRollsBackAll(t *testing.T) {
	t.Parallel()
	s, _, _, ends := startCanary(t, 3, "serve-ready-slot-0", nil, Canary{N: 1})
	end, err := s.Promote(nil)
	var ab *AbandonedError
	if err != nil || end.Outcome != CanaryFailed || !errors.As(end.Err, &ab) || !ab.RolledBack {
		t.Fatalf("Promote: %+v, %v; want failed and rolled back", end, err)
	}
	ends.next(t)
	if got := releases(s); !slices.Equal(got, []string{"v1", "v1", "v1"}) {
		t.Fatalf("releases %v, want v1 everywhere", got)
	}
	if st := s.Status(); st.State != AppRunning || st.Release != "v1" {
		t.Errorf("state %s release %s", st.State, st.Release)
	}
}

func TestCanaryRefusedChangesNothing(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	before := pids(currentWorkers(s))
	for _, n := range []int{0, 2, 5} {
		err := s.ReloadCanary(nextSpec(spec, "serve-ready"), Rolling, Canary{N: n}, nil)
		if !errors.Is(err, ErrBadCanary) {
			t.Errorf("canary of %d: %v, want ErrBadCanary", n, err)
		}
	}
	if st := s.Status(); st.State != AppRunning || s.Spec() != spec || !slices.Equal(pids(currentWorkers(s)), before) {
		t.Errorf("a refused canary changed the app: %s, %v -> %v", st.State, before, pids(currentWorkers(s)))
	}
	if _, err := s.Promote(nil); !errors.Is(err, ErrNoCanary) {
		t.Errorf("Promote without a hold: %v", err)
	}
}

// Stop during a hold stops everything, timer included (goleak checks).
func TestCanaryStopDuringHold(t *testing.T) {
	t.Parallel()
	s, old, _, ends := startCanary(t, 2, "serve-ready", nil, Canary{N: 1, Timeout: time.Hour, Action: CanaryPromote})
	all := append(currentWorkers(s), old...)
	s.Stop()
	for _, w := range all {
		if !isClosed(w.Done()) {
			t.Errorf("pid %d runs after Stop", w.PID)
		}
	}
	select {
	case e := <-ends:
		t.Errorf("Stop ended the hold with %+v; it must just stop", e)
	default:
	}
}

// A blue-green canary starts all its canaries before any old worker
// drains; its promote moves the rest at once too.
func TestCanaryBlueGreen(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 4)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	var rec recorder
	if err := s.ReloadCanary(nextSpec(spec, "serve-ready"), BlueGreen, Canary{N: 2}, rec.add); err != nil {
		t.Fatal(err)
	}
	want := []string{"started/0", "started/1", "ready/0", "ready/1"}
	if got := rec.steps(); len(got) < 4 || !slices.Equal(got[:4], want) {
		t.Fatalf("canary events %q, want them to start with %q", got, want)
	}
	if got := releases(s); !slices.Equal(got, []string{"v2", "v2", "v1", "v1"}) {
		t.Fatalf("releases during the hold %v", got)
	}
	rec = recorder{}
	if end, err := s.Promote(rec.add); err != nil || end.Outcome != CanaryPromoted {
		t.Fatalf("Promote: %+v, %v", end, err)
	}
	want = []string{"started/2", "started/3", "ready/2", "ready/3"}
	if got := rec.steps(); len(got) < 4 || !slices.Equal(got[:4], want) {
		t.Fatalf("promote events %q, want them to start with %q", got, want)
	}
	if got := releases(s); !slices.Equal(got, []string{"v2", "v2", "v2", "v2"}) {
		t.Fatalf("releases after promote %v", got)
	}
}

// A slot that is not a canary and crash-loops during the hold errors the
// app (max_restarts 0: its first crash). An abort leaves that slot alone,
// so the app stays errored (not running with a dead slot nobody restarts)
// until a restart; a promote gives it a worker of the new release, and the
// app runs.
func TestCanaryEndKeepsAppErroredByCrashLoop(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"abort", "promote"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			spec := testSpec(t, newListener(t), "serve-ready", 2)
			spec.Restart.MaxRestarts = 0
			s := newSupervisor(t, spec)
			mustStart(t, s)
			ends := make(canaryEnds, 1)
			if err := s.ReloadCanary(nextSpec(spec, "serve-ready"), Rolling, Canary{N: 1, OnEnd: ends.add}, nil); err != nil {
				t.Fatalf("ReloadCanary: %v", err)
			}
			other := currentWorkers(s)[1]
			if err := syscall.Kill(other.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-other.Done()
			waitFor(t, "the crash of slot 1 to error the app", func() bool { return s.Status().State == AppErrored })
			if st := s.Status(); st.Canary == nil {
				t.Fatalf("the crash of slot 1, not a canary, ended the hold: last %+v", st.LastCanary)
			}
			endHold, want := s.Abort, AppErrored
			if end == "promote" {
				endHold, want = s.Promote, AppRunning
			}
			if e, err := endHold(nil); err != nil || e.Err != nil {
				t.Fatalf("%s: %+v, %v", end, e, err)
			}
			ends.next(t)
			st := s.Status()
			if st.State != want || st.Canary != nil {
				t.Fatalf("after the %s: state %s, canary %+v; want %s, no hold", end, st.State, st.Canary, want)
			}
			if end == "promote" {
				if w := currentWorkers(s)[1]; w == other || w.State() != Ready || !slices.Equal(releases(s), []string{"v2", "v2"}) {
					t.Errorf("after the promote: slot 1 %s, releases %v; want a new ready worker, v2 everywhere", w.State(), releases(s))
				}
				return
			}
			if w := currentWorkers(s)[1]; w != other {
				t.Errorf("the errored slot 1 got a new worker (pid %d) at the hold's end", w.PID)
			}
			if err := s.Restart(nil); err != nil {
				t.Fatalf("Restart: %v", err)
			}
			if st := s.Status(); st.State != AppRunning || !slices.Equal(releases(s), []string{"v1", "v1"}) {
				t.Errorf("after restart: state %s, releases %v; want running on v1", st.State, releases(s))
			}
		})
	}
}
