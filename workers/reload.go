package workers

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Strategy is how a reload replaces workers.
type Strategy string

// Reload strategies.
const (
	// Rolling replaces max_surge slots at a time: start new, wait until
	// ready, stop old.
	Rolling Strategy = "rolling"
	// BlueGreen starts every new worker, waits until all are ready, then
	// stops every old one.
	BlueGreen Strategy = "blue-green"
)

// Event is one step of a reload, streamed to the CLI.
type Event struct {
	Time    time.Time `json:"time"`
	App     string    `json:"app"`
	Type    string    `json:"type"` // started, ready, draining, exited, failed, rollback
	Slot    int       `json:"slot"`
	PID     int       `json:"pid,omitempty"`
	Release string    `json:"release,omitempty"`
	Millis  int64     `json:"ms,omitempty"`
	Message string    `json:"message,omitempty"`
}

// AbandonedError is returned by Reload when a new worker did not get ready:
// new workers were stopped and every slot runs the previous version again.
type AbandonedError struct {
	Reason     error
	ExitStatus string   // of the new worker, when it exited
	LastLines  []string // of the new worker's output
	RolledBack bool     // every slot runs the previous version again
}

func (e *AbandonedError) Error() string {
	return fmt.Sprintf("reload abandoned, previous version still serving: %v", e.Reason)
}

func (e *AbandonedError) Unwrap() error { return e.Reason }

// Reload moves the app to spec. A reload, restart or scale already running
// gives ErrBusy at once. progress may be nil; calls to it never overlap and
// all happen before Reload returns, but old workers drain in their own
// goroutines, so a call may come from one of those.
func (s *Supervisor) Reload(spec *Spec, strategy Strategy, progress func(Event)) error {
	if !s.op.TryLock() {
		return ErrBusy
	}
	defer s.op.Unlock()
	emit := s.emitter(progress) // drains emit concurrently
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrCanceled
	}
	if s.state == AppStopped {
		// A stopped app stays stopped; it starts on spec later.
		s.spec = spec
		s.mu.Unlock()
		return nil
	}
	old, prev := s.spec, s.state
	s.spec = spec
	s.state = AppReloading
	slots := slices.Clone(s.slots)
	s.mu.Unlock()

	start := time.Now() // for Counters
	err := s.reload(slots, old, spec, strategy, emit)
	s.ctr.reloaded(time.Since(start), err)
	s.mu.Lock()
	switch {
	case s.closed:
	case err != nil:
		s.spec, s.state = old, prev
	default:
		s.state = AppRunning
		for _, sl := range s.slots {
			sl.crashes = nil
		}
	}
	s.mu.Unlock()
	s.ensureMonitor()
	return err
}

func (s *Supervisor) reload(slots []*slot, old, spec *Spec, strategy Strategy, emit func(Event)) error {
	keep := min(len(slots), spec.Instances)
	batch := max(spec.MaxSurge, 1)
	if strategy == BlueGreen {
		batch = max(spec.Instances, 1)
	}
	// Slots to add when growing.
	var added []*slot
	s.mu.Lock()
	for i := len(slots); i < spec.Instances; i++ {
		sl := &slot{index: i, spec: spec, backoff: spec.Restart.Backoff}
		s.slots = append(s.slots, sl)
		added = append(added, sl)
	}
	s.mu.Unlock()
	all := append(slices.Clone(slots[:keep]), added...)

	var done []*slot
	for i := 0; i < len(all); i += batch {
		group := all[i:min(i+batch, len(all))]
		if err := s.replaceGroup(group, spec, emit, ""); err != nil {
			if errors.Is(err, ErrCanceled) {
				return err // shutting down: no rollback
			}
			abandoned := abandon(err)
			kept := slices.DeleteFunc(slices.Clone(done), func(sl *slot) bool { return slices.Contains(added, sl) })
			abandoned.RolledBack = s.rollback(kept, old, emit)
			s.dropSlots(added)
			return abandoned
		}
		done = append(done, group...)
	}
	// Shrink: drain the highest slots.
	if spec.Instances < len(slots) {
		s.mu.Lock()
		gone := slices.Clone(s.slots[spec.Instances:])
		s.slots = s.slots[:spec.Instances]
		s.mu.Unlock()
		s.drainSlots(gone, emit)
	}
	return nil
}

func abandon(err error) *AbandonedError {
	a := &AbandonedError{Reason: err}
	var nr *NotReadyError
	if errors.As(err, &nr) {
		a.LastLines = nr.Worker.LastLines()
		if nr.Exited {
			a.ExitStatus = nr.Worker.ExitDescription()
		}
	}
	return a
}

// rollback moves slots that were already swapped back to spec, readiness-
// gated like a reload. It reports whether every slot runs spec again.
func (s *Supervisor) rollback(done []*slot, spec *Spec, emit func(Event)) bool {
	ok := true
	for _, sl := range done {
		if err := s.replaceGroup([]*slot{sl}, spec, emit, "rollback"); err != nil {
			s.log.Error("rollback of a slot failed; it keeps the new version", "worker", sl.index, "error", err)
			ok = false
		}
	}
	return ok
}

// dropSlots removes slots added by a failed grow; their workers are gone.
func (s *Supervisor) dropSlots(added []*slot) {
	if len(added) == 0 {
		return
	}
	s.drainSlots(added, func(Event) {})
	s.mu.Lock()
	s.slots = slices.DeleteFunc(s.slots, func(sl *slot) bool { return slices.Contains(added, sl) })
	s.mu.Unlock()
}

// drainSlots stops the workers of slots that are no longer part of the pool.
func (s *Supervisor) drainSlots(gone []*slot, emit func(Event)) {
	var wg sync.WaitGroup
	for _, sl := range gone {
		s.mu.Lock()
		w, spec := sl.cur, sl.spec
		sl.cur = nil
		s.mu.Unlock()
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			emit(Event{Type: "draining", Slot: sl.index, PID: w.PID, Release: w.Release})
			t := time.Now()
			w.Stop(spec.StopSignal, spec.StopTimeout, Draining)
			emit(Event{Type: "exited", Slot: sl.index, PID: w.PID, Millis: time.Since(t).Milliseconds(),
				Message: w.ExitDescription()})
		}()
	}
	wg.Wait()
}

// replaceGroup starts a new worker on spec for every slot of group, waits
// until all are ready, swaps them in, then drains the old ones. If one is
// not ready, every new worker of the group is stopped and the old ones keep
// their slots.
func (s *Supervisor) replaceGroup(group []*slot, spec *Spec, emit func(Event), note string) error {
	news := make([]*Worker, 0, len(group))
	stopNews := func() {
		var wg sync.WaitGroup
		for _, w := range news {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.Stop(spec.StopSignal, spec.StopTimeout, Stopping)
			}()
		}
		wg.Wait()
		s.mu.Lock()
		for _, sl := range group {
			sl.extra = slices.DeleteFunc(sl.extra, func(w *Worker) bool { return slices.Contains(news, w) })
		}
		s.mu.Unlock()
	}
	for _, sl := range group {
		w, err := spawn(s.args(), spec, sl.index)
		if err != nil {
			stopNews()
			return fmt.Errorf("worker %d: %w", sl.index, err)
		}
		s.mu.Lock()
		sl.extra = append(sl.extra, w)
		s.mu.Unlock()
		news = append(news, w)
		emit(Event{Type: "started", Slot: sl.index, PID: w.PID, Release: spec.Release, Message: note})
	}
	deadline := time.Now().Add(spec.ReadyTimeout)
	for _, w := range news {
		if err := waitReady(w, time.Until(deadline), s.closing); err != nil {
			if nr, ok := err.(*NotReadyError); ok && !nr.Exited {
				nr.Timeout = spec.ReadyTimeout
			}
			emit(Event{Type: "failed", Slot: w.Slot, PID: w.PID, Message: err.Error()})
			stopNews()
			return err
		}
		emit(Event{Type: "ready", Slot: w.Slot, PID: w.PID, Millis: w.ReadyAfter().Milliseconds(), Message: note})
	}
	type retired struct {
		w    *Worker
		spec *Spec
	}
	var olds []retired
	s.mu.Lock()
	for k, sl := range group {
		nw := news[k]
		sl.extra = slices.DeleteFunc(sl.extra, func(w *Worker) bool { return w == nw })
		if sl.cur != nil {
			olds = append(olds, retired{sl.cur, sl.spec})
			sl.extra = append(sl.extra, sl.cur)
		}
		sl.cur, sl.spec, sl.backoff = nw, spec, spec.Restart.Backoff
	}
	s.mu.Unlock()
	for k, sl := range group {
		s.watch(sl, news[k])
	}
	var wg sync.WaitGroup
	for _, o := range olds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			emit(Event{Type: "draining", Slot: o.w.Slot, PID: o.w.PID, Release: o.w.Release})
			t := time.Now()
			o.w.Stop(o.spec.StopSignal, o.spec.StopTimeout, Draining)
			emit(Event{Type: "exited", Slot: o.w.Slot, PID: o.w.PID, Millis: time.Since(t).Milliseconds(),
				Message: o.w.ExitDescription()})
			s.mu.Lock()
			for _, g := range group {
				g.extra = slices.DeleteFunc(g.extra, func(w *Worker) bool { return w == o.w })
			}
			s.mu.Unlock()
		}()
	}
	wg.Wait()
	return nil
}
