package workers

import (
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/deployd/deployd/handoff"
)

// A reload that collides with the max_memory monitor's replacement is told
// what runs, not "another reload".
func TestReloadCollidingWithMemoryReplacementNamesIt(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "first-only", 1)
	// The replacement never gets ready: it runs until ready_timeout.
	spec.Env = append(spec.Env, "MARKER_DIR="+t.TempDir(), "THEN=hang")
	spec.MaxMemory = 1 // every worker is over it
	s := newSupervisor(t, spec)
	mustStart(t, s)
	waitFor(t, "the monitor to start a replacement", func() bool { return len(s.Status().Workers) == 2 })

	err := s.Reload(nextSpec(spec, "serve-ready"), Rolling, nil)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Reload during a replacement = %v, want ErrBusy", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "memory-limit replacement of worker 0 running") ||
		strings.Contains(msg, "another reload") {
		t.Errorf("refusal %q does not name the memory-limit replacement", msg)
	}
	var be *BusyError
	if !errors.As(err, &be) || be.Op != "memory-limit replacement of worker 0" || be.By != "the max_memory monitor" {
		t.Errorf("refusal %#v, want a *BusyError naming the replacement and the monitor", err)
	}
}

// Reading the status does not change the CPU sample it reads: a second read
// right after the first shows the same busy worker as busy.
func TestStatusReadsDoNotChangeTheSample(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "burn", 1))
	mustStart(t, s)
	waitFor(t, "a CPU sample of the busy worker", func() bool { return s.Status().Workers[0].CPUPercent > 5 })
	limit := 100*float64(runtime.NumCPU()) + 10
	for range 5 {
		a, b := s.Status().Workers[0], s.Status().Workers[0]
		for _, w := range []WorkerStatus{a, b} {
			if w.CPUPercent <= 5 || w.CPUPercent > limit || w.RSSBytes <= 0 {
				t.Fatalf("busy worker read as CPU %.1f%%, RSS %d (reads %.1f%%, %.1f%%)", w.CPUPercent, w.RSSBytes,
					a.CPUPercent, b.CPUPercent)
			}
		}
	}
}

// When the rollback of an abandoned reload fails, the error says which
// release each slot runs instead of "previous version still serving".
func TestAbandonedAfterFailedRollbackSaysWhatServes(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "first-only", 2)
	spec.Env = append(spec.Env, "MARKER_DIR="+t.TempDir())
	s := newSupervisor(t, spec)
	mustStart(t, s)

	// Slot 0 gets ready on v2, slot 1 fails; the rollback of slot 0 to v1
	// fails too (first-only exits the second time).
	spec2 := nextSpec(spec, "serve-ready-slot-0")
	l2 := newListener(t) // only v2 has it
	spec2.Listeners = append(slices.Clone(spec.Listeners), handoff.Bound{Listener: l2, Name: "extra"})
	err := s.Reload(spec2, Rolling, nil)
	var ab *AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("Reload = %v, want *AbandonedError", err)
	}
	if ab.RolledBack {
		t.Error("RolledBack = true, but slot 0 could not be rolled back")
	}
	msg := err.Error()
	if strings.Contains(msg, "previous version still serving") {
		t.Errorf("error %q claims the previous version serves", msg)
	}
	for _, want := range []string{"worker 0 runs v2", "worker 1 runs v1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	waitDrained(t, s)
	st := s.Status()
	if len(st.Workers) != 2 || st.Workers[0].Release != "v2" || st.Workers[1].Release != "v1" {
		t.Errorf("after a failed rollback: %+v", st.Workers)
	}
}

// Status right after Start shows the memory of the ready workers: the loop
// samples a worker when it gets ready, not only on its next tick.
func TestStatusAfterStartShowsMemory(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 2))
	mustStart(t, s)
	for _, w := range s.Status().Workers {
		if w.RSSBytes < 1<<20 {
			t.Errorf("worker %d: RSS %d right after Start, want the ready process's (> 1 MiB)", w.Slot, w.RSSBytes)
		}
	}
}

// An app's first release that never gets ready had no previous version:
// the error says nothing serves, not "previous version still serving".
func TestAbandonedFirstReleaseSaysNothingServes(t *testing.T) {
	t.Parallel()
	// An app of releases starts with no worker until its first deploy.
	empty := testSpec(t, newListener(t), "exit-now", 0)
	s := newSupervisor(t, empty)
	mustStart(t, s)
	spec := nextSpec(empty, "exit-now")
	spec.Instances = 1
	err := s.Reload(spec, Rolling, nil)
	var ab *AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("Reload = %v, want *AbandonedError", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "previous version still serving") || !strings.Contains(msg, "no previous version: nothing served before and nothing serves now") {
		t.Errorf("error %q does not say that there was no previous version and nothing serves", msg)
	}
}
