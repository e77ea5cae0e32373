package workers

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

// next returns the next event of kind from ch, failing after waitTimeout.
func nextEvent(t *testing.T, ch <-chan Event, kind EventKind) Event {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed while waiting for %s", kind)
			}
			if e.Type == kind {
				return e
			}
		case <-deadline:
			t.Fatalf("timed out waiting for a %s event", kind)
		}
	}
}

// A crash and the restart that follows are events, not only log lines.
func TestCrashAndRestartAreEvents(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 1))
	mustStart(t, s)
	events, cancel := s.Subscribe()
	defer cancel()
	old := currentWorkers(s)[0]
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	crash := nextEvent(t, events, EventCrash)
	if crash.Slot != 0 || crash.PID != old.PID || crash.Message != "signal: killed" || crash.App != "web" || crash.Time.IsZero() {
		t.Errorf("crash event %+v, want slot 0 pid %d signal: killed", crash, old.PID)
	}
	restart := nextEvent(t, events, EventRestart)
	nw := currentWorkers(s)[0]
	if restart.Slot != 0 || restart.PID != nw.PID || restart.PID == old.PID || restart.Release != "v1" {
		t.Errorf("restart event %+v, want slot 0 with the new pid %d", restart, nw.PID)
	}
	if ready := nextEvent(t, events, EventReady); ready.PID != nw.PID {
		t.Errorf("ready event %+v, want pid %d", ready, nw.PID)
	}
}

// An app that crashes too often publishes errored.
func TestCrashLoopPublishesErrored(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "exit-now", 1)
	spec.Restart.MaxRestarts = 1
	s := newSupervisor(t, spec)
	events, cancel := s.Subscribe()
	defer cancel()
	if err := s.Start(); err == nil {
		t.Fatal("Start of a crashing app succeeded")
	}
	e := nextEvent(t, events, EventErrored)
	if e.Message != string(AppErrored) || s.Status().State != AppErrored {
		t.Errorf("errored event %+v, state %s", e, s.Status().State)
	}
}

// A subscriber that never reads does not hold the supervisor up: its
// events are dropped and counted. Stop closes the subscription.
func TestSlowSubscriberDoesNotBlock(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	events, cancel := s.Subscribe()
	defer cancel()
	mustStart(t, s)
	for spec.Generation < 12 { // each reload publishes about 7 events
		spec = nextSpec(spec, "serve-ready")
		if err := s.Reload(spec, Rolling, nil); err != nil {
			t.Fatalf("Reload %s: %v", spec.Release, err)
		}
	}
	if c := s.Counters(); c.DroppedEvents == 0 {
		t.Errorf("DroppedEvents = 0 after %d unread events", len(events))
	}
	if len(events) != subscriberBuffer {
		t.Errorf("%d events buffered, want a full buffer of %d", len(events), subscriberBuffer)
	}
	s.Stop()
	n := 0
	for range events {
		n++
	}
	if n != subscriberBuffer {
		t.Errorf("read %d events before the close, want %d", n, subscriberBuffer)
	}
	cancel() // after Stop: a no-op
}

// A busy refusal is a *BusyError that names the running operation.
func TestBusyErrorNamesTheOperation(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	spec2 := nextSpec(spec, "never-ready")
	spec2.ReadyTimeout = waitTimeout
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Reload(spec2, Rolling, func(e Event) {
			if e.Type == EventStarted {
				close(started)
			}
		})
	}()
	waitChan(t, "the reload to start a worker", started)
	err := s.Scale(3, nil)
	var be *BusyError
	if !errors.As(err, &be) || be.App != "web" || be.Op != "reload to release v2" || be.Since.IsZero() {
		t.Fatalf("Scale during a reload = %v (%+v), want a *BusyError naming the reload", err, be)
	}
	if !strings.HasPrefix(err.Error(), "workers: web is busy: reload to release v2 running since ") {
		t.Errorf("refusal %q", err)
	}
	if st := s.Status(); st.Busy == nil || st.Busy.Op != be.Op {
		t.Errorf("Status().Busy = %+v during the reload", st.Busy)
	}
	s.Stop()
	if err := <-done; !errors.Is(err, ErrCanceled) {
		t.Errorf("Reload canceled by Stop = %v", err)
	}
}
