package workers

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// checkReplaced checks that every slot runs a new ready worker of spec and
// that the old ones are gone after a clean drain.
func checkReplaced(t *testing.T, s *Supervisor, old []*Worker, spec *Spec) {
	t.Helper()
	waitDrained(t, s)
	st := s.Status()
	if st.State != AppRunning || st.Release != spec.Release || len(st.Workers) != spec.Instances {
		t.Fatalf("after reload: state %s, release %s, %d workers: %+v", st.State, st.Release, len(st.Workers), st.Workers)
	}
	oldPIDs := pids(old)
	for i, w := range st.Workers {
		if w.Slot != i || w.State != Ready || w.Generation != spec.Generation || w.Release != spec.Release ||
			slices.Contains(oldPIDs, w.PID) {
			t.Errorf("slot %d after reload: %+v (old pids %v)", i, w, oldPIDs)
		}
	}
	for i, w := range old {
		if !isClosed(w.Done()) {
			t.Errorf("old worker %d (pid %d) still runs", i, w.PID)
		} else if exitCode(w) != 0 {
			t.Errorf("old worker %d: %s, want a clean exit on SIGTERM", i, w.ExitDescription())
		}
	}
	if s.Spec() != spec {
		t.Error("Spec() is not the new spec")
	}
}

func TestReloadRolling(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	spec2 := nextSpec(spec, "serve-ready")
	var rec recorder
	if err := s.Reload(spec2, Rolling, rec.add); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	checkReplaced(t, s, old, spec2)

	// One slot at a time: start new, ready, drain old (its exit comes in
	// the background).
	want := []string{
		"started/0", "ready/0", "draining/0",
		"started/1", "ready/1", "draining/1",
	}
	if got := rec.settledSteps(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	nw := currentWorkers(s)
	for slot := range 2 {
		ev := rec.forSlot(slot)
		if ev[0].PID != nw[slot].PID || ev[1].PID != nw[slot].PID || ev[0].Release != "v2" {
			t.Errorf("slot %d: started/ready %+v %+v, want new pid %d of v2", slot, ev[0], ev[1], nw[slot].PID)
		}
		if ev[2].PID != old[slot].PID || ev[2].Release != "v1" {
			t.Errorf("slot %d: draining %+v, want old pid %d of v1", slot, ev[2], old[slot].PID)
		}
		if len(ev) > 3 && (ev[3].Type != EventExited || ev[3].PID != old[slot].PID || ev[3].Message != fmt.Sprintf(`exit status 0; last status "serving %d"`, slot)) {
			t.Errorf("slot %d: after draining %+v", slot, ev[3])
		}
		for _, e := range ev {
			if e.App != "web" || e.Time.IsZero() {
				t.Errorf("event without app or time: %+v", e)
			}
		}
	}
}

func TestReloadBlueGreen(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	spec2 := nextSpec(spec, "serve-ready")
	var rec recorder
	if err := s.Reload(spec2, BlueGreen, rec.add); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	checkReplaced(t, s, old, spec2)

	steps := rec.steps()
	lastReady := -1
	firstDrain := len(steps)
	for i, e := range rec.events {
		switch e.Type {
		case "ready":
			lastReady = i
		case "draining":
			firstDrain = min(firstDrain, i)
		}
	}
	if lastReady < 0 || firstDrain == len(steps) || lastReady > firstDrain {
		t.Errorf("events %q: every new worker must be ready before the first old one drains", steps)
	}
	for slot := range 2 {
		var types []string
		for _, e := range rec.forSlot(slot) {
			types = append(types, string(e.Type))
		}
		if want := []string{"started", "ready", "draining", "exited"}; !slices.Equal(types, want) &&
			!slices.Equal(types, want[:3]) {
			t.Errorf("slot %d events %q, want %q (exited: if the drain ended before the reload)", slot, types, want)
		}
	}
}

func TestReloadAbandonedWhenWorkerExits(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	var rec recorder
	err := s.Reload(nextSpec(spec, "exit-now"), Rolling, rec.add)
	var ab *AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("Reload = %v, want *AbandonedError", err)
	}
	if ab.ExitStatus != "exit status 3" {
		t.Errorf("ExitStatus = %q, want exit status 3", ab.ExitStatus)
	}
	if !slices.Contains(ab.LastLines, "helper: cannot load config: boom") {
		t.Errorf("LastLines = %q, want the new worker's output", ab.LastLines)
	}
	if !ab.RolledBack {
		t.Error("RolledBack = false, nothing was swapped")
	}
	var nr *NotReadyError
	if !errors.As(err, &nr) || !nr.Exited {
		t.Errorf("Reason = %v, want a NotReadyError for an exited worker", ab.Reason)
	}
	if want := []string{"started/0", "failed/0"}; !slices.Equal(rec.steps(), want) {
		t.Errorf("events %q, want %q", rec.steps(), want)
	}

	// The previous version keeps serving, untouched.
	if got := pids(currentWorkers(s)); !slices.Equal(got, pids(old)) {
		t.Errorf("pids %v after an abandoned reload, want %v", got, pids(old))
	}
	st := s.Status()
	if st.State != AppRunning || st.Release != "v1" || s.Spec() != spec || len(st.Workers) != 2 {
		t.Errorf("after an abandoned reload: %+v", st)
	}
	for _, w := range st.Workers {
		if w.Generation != 1 || w.State != Ready {
			t.Errorf("worker after an abandoned reload: %+v", w)
		}
	}
}

func TestReloadAbandonedAfterReadyTimeout(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	spec2 := nextSpec(spec, "never-ready")
	spec2.ReadyTimeout = 300 * time.Millisecond
	t0 := time.Now()
	err := s.Reload(spec2, Rolling, nil)
	d := time.Since(t0)
	var ab *AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("Reload = %v, want *AbandonedError", err)
	}
	var nr *NotReadyError
	if !errors.As(err, &nr) || nr.Exited || nr.Timeout != spec2.ReadyTimeout {
		t.Errorf("Reason = %v, want a ready_timeout NotReadyError", ab.Reason)
	}
	if ab.ExitStatus != "" {
		t.Errorf("ExitStatus = %q for a worker that did not exit on its own", ab.ExitStatus)
	}
	if d < spec2.ReadyTimeout || d > spec2.ReadyTimeout+spec2.StopTimeout+5*time.Second {
		t.Errorf("abandoned after %s, want ready_timeout %s", d, spec2.ReadyTimeout)
	}
	if got := pids(currentWorkers(s)); !slices.Equal(got, pids(old)) {
		t.Errorf("pids %v, want %v", got, pids(old))
	}
	if isClosed(old[0].Done()) || old[0].State() != Ready {
		t.Error("the old worker did not keep serving")
	}
}

// A failure in a later batch rolls the swapped slots back to the previous
// version, readiness-gated.
func TestReloadRollsBackSwappedSlots(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	var rec recorder
	err := s.Reload(nextSpec(spec, "serve-ready-slot-0"), Rolling, rec.add)
	var ab *AbandonedError
	if !errors.As(err, &ab) || !ab.RolledBack || ab.ExitStatus != "exit status 3" {
		t.Fatalf("Reload = %v (%+v), want abandoned and rolled back", err, ab)
	}
	want := []string{
		"started/0", "ready/0", "draining/0",
		"started/1", "failed/1",
		"started/0", "ready/0", "draining/0",
	}
	if got := rec.settledSteps(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	for _, e := range rec.events {
		if (e.Type == EventStarted || e.Type == EventReady) && e.Release == "v1" && e.Message != "rollback" {
			t.Errorf("rollback event without the note: %+v", e)
		}
	}
	waitDrained(t, s)
	st := s.Status()
	if st.Release != "v1" || len(st.Workers) != 2 {
		t.Fatalf("after rollback: %+v", st)
	}
	for i, w := range st.Workers {
		if w.Generation != 1 || w.Release != "v1" || w.State != Ready {
			t.Errorf("slot %d after rollback: %+v", i, w)
		}
	}
	if st.Workers[0].PID == old[0].PID {
		t.Error("slot 0 was not replaced by a rolled-back worker")
	}
	if st.Workers[1].PID != old[1].PID {
		t.Error("slot 1 was disturbed")
	}
}

func TestReloadBusyThenStop(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)

	started := make(chan struct{})
	var newPID int // set before started is closed
	done := make(chan error, 1)
	spec2 := nextSpec(spec, "never-ready")
	spec2.ReadyTimeout = waitTimeout
	go func() {
		done <- s.Reload(spec2, Rolling, func(e Event) {
			if e.Type == "started" {
				newPID = e.PID
				close(started)
			}
		})
	}()
	waitChan(t, "the reload to start a worker", started)

	t0 := time.Now()
	if err := s.Reload(nextSpec(spec, "serve-ready"), BlueGreen, nil); !errors.Is(err, ErrBusy) {
		t.Errorf("concurrent Reload = %v, want ErrBusy", err)
	}
	if err := s.Restart(nil); !errors.Is(err, ErrBusy) {
		t.Errorf("concurrent Restart = %v, want ErrBusy", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("ErrBusy took %s, want it at once", d)
	}
	if st := s.Status(); st.State != AppReloading {
		t.Errorf("state %s during a reload", st.State)
	}

	// Stop cancels the running reload and waits for it.
	t0 = time.Now()
	s.Stop()
	if d := time.Since(t0); d > spec.StopTimeout+5*time.Second {
		t.Errorf("Stop took %s", d)
	}
	if !processGone(newPID) {
		t.Errorf("the canceled reload's worker (pid %d) outlived Stop", newPID)
	}
	select {
	case err := <-done:
		// A shutdown is not an abandon: no rollback is started.
		var ab *AbandonedError
		if !errors.Is(err, ErrCanceled) || errors.As(err, &ab) {
			t.Errorf("Reload canceled by Stop = %v, want ErrCanceled (not abandoned)", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the canceled Reload did not return")
	}
}

func TestReloadGrowAndShrink(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	grow := nextSpec(spec, "serve-ready")
	grow.Instances = 3
	var rec recorder
	if err := s.Reload(grow, Rolling, rec.add); err != nil {
		t.Fatalf("grow: %v", err)
	}
	checkReplaced(t, s, old, grow)
	want := []string{
		"started/0", "ready/0", "draining/0",
		"started/1", "ready/1",
		"started/2", "ready/2",
	}
	if got := rec.settledSteps(); !slices.Equal(got, want) {
		t.Errorf("grow events %q, want %q", got, want)
	}

	old = currentWorkers(s)
	shrink := nextSpec(grow, "serve-ready")
	shrink.Instances = 1
	rec = recorder{}
	if err := s.Reload(shrink, Rolling, rec.add); err != nil {
		t.Fatalf("shrink: %v", err)
	}
	checkReplaced(t, s, old, shrink)
	for _, slot := range []int{1, 2} {
		var types []string
		for _, e := range rec.forSlot(slot) {
			types = append(types, string(e.Type))
			if e.PID != old[slot].PID {
				t.Errorf("slot %d drained pid %d, want %d", slot, e.PID, old[slot].PID)
			}
		}
		if want := []string{"draining", "exited"}; !slices.Equal(types, want) {
			t.Errorf("slot %d events %q, want %q", slot, types, want)
		}
	}
}

// A reload that fails while growing drops the slots it added.
func TestReloadGrowAbandoned(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	grow := nextSpec(spec, "serve-ready-slot-0")
	grow.Instances = 2
	err := s.Reload(grow, Rolling, nil)
	var ab *AbandonedError
	if !errors.As(err, &ab) || !ab.RolledBack {
		t.Fatalf("Reload = %v, want abandoned and rolled back", err)
	}
	waitDrained(t, s)
	st := s.Status()
	if st.Instances != 1 || len(st.Workers) != 1 || st.Workers[0].Release != "v1" || st.Workers[0].State != Ready {
		t.Errorf("after an abandoned grow: %+v", st)
	}
	if !isClosed(old[0].Done()) {
		t.Error("the first old worker should have been replaced by the rollback")
	}
}

// A new worker that is ready and exits 0 within min_ready abandons the
// reload before any old worker is stopped.
func TestReloadAbandonedWhenReadyThenExit(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	old := currentWorkers(s)

	spec2 := nextSpec(spec, "ready-then-exit")
	spec2.Env = append(spec2.Env, "EXIT_AFTER=100ms")
	spec2.MinReady = 5 * time.Second
	t0 := time.Now()
	err := s.Reload(spec2, Rolling, nil)
	var ab *AbandonedError
	var nr *NotReadyError
	if !errors.As(err, &ab) || !errors.As(err, &nr) || !nr.AfterReady {
		t.Fatalf("Reload = %v, want an AbandonedError for a worker that exited after ready", err)
	}
	if d := time.Since(t0); d >= spec2.MinReady {
		t.Errorf("abandoned after %s: it waited out min_ready %s instead of seeing the exit", d, spec2.MinReady)
	}
	if ab.ExitStatus != "exit status 0" || !ab.RolledBack {
		t.Errorf("ExitStatus %q RolledBack %v, want exit status 0 and true", ab.ExitStatus, ab.RolledBack)
	}
	if got := pids(currentWorkers(s)); !slices.Equal(got, pids(old)) {
		t.Errorf("pids %v, want the old %v untouched", got, pids(old))
	}
	if st := s.Status(); st.State != AppRunning || st.Release != "v1" {
		t.Errorf("after the abandon: state %s release %s, want running v1", st.State, st.Release)
	}
}

// Without a bake time, a new worker that exits after it was swapped in
// (while a later batch gets ready) still abandons the reload, and the
// swapped slots go back to the previous version.
func TestReloadAbandonedWhenSwappedWorkerExits(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)

	spec2 := nextSpec(spec, "ready-then-exit")
	spec2.Env = append(spec2.Env, "EXIT_SLOT=0", "EXIT_AFTER=200ms", "READY_AFTER=1s")
	err := s.Reload(spec2, Rolling, nil)
	var ab *AbandonedError
	var nr *NotReadyError
	if !errors.As(err, &ab) || !errors.As(err, &nr) || !nr.AfterReady || nr.Worker.Slot != 0 {
		t.Fatalf("Reload = %v, want an AbandonedError for worker 0 exiting after ready", err)
	}
	if !ab.RolledBack {
		t.Errorf("RolledBack = false: %v", ab.Slots)
	}
	for _, w := range currentWorkers(s) {
		if w == nil || w.Release != "v1" || isClosed(w.Done()) {
			t.Errorf("after the abandon, a slot runs %+v; want a live v1 worker", w)
		}
	}
}

// Only the first batch of a rolling reload bakes min_ready: the old worker
// of slot 0 drains min_ready after its replacement got ready, slot 1's as
// soon as its replacement is ready.
func TestReloadBakesFirstBatchOnly(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 2)
	s := newSupervisor(t, spec)
	mustStart(t, s)

	spec2 := nextSpec(spec, "serve-ready")
	spec2.MinReady = 3 * time.Second
	var rec recorder
	if err := s.Reload(spec2, Rolling, rec.add); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	for slot, baked := range []bool{true, false} {
		ev := rec.forSlot(slot) // started, ready, draining, exited
		if len(ev) < 3 || ev[1].Type != EventReady || ev[2].Type != EventDraining {
			t.Fatalf("slot %d: events %+v", slot, ev)
		}
		waited := ev[2].Time.Sub(ev[1].Time)
		if baked && waited < spec2.MinReady {
			t.Errorf("slot %d: old worker drained %s after its replacement was ready, want >= min_ready %s", slot, waited, spec2.MinReady)
		}
		if !baked && waited >= spec2.MinReady {
			t.Errorf("slot %d: old worker drained %s after ready: a later batch baked again", slot, waited)
		}
	}
}
