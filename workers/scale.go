package workers

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// emitter wraps progress so that calls never overlap and carry the app and
// the time.
func (s *Supervisor) emitter(progress func(Event)) func(Event) {
	var mu sync.Mutex
	return func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		e.Time, e.App = time.Now(), s.opts.App
		s.log.Debug("event", "event", e.Type, "worker", e.Slot, "pid", e.PID, "ms", e.Millis, "message", e.Message)
		if progress != nil {
			progress(e)
		}
	}
}

// Scale changes the number of workers to n (>= 0) on the current spec: new
// slots start and must get ready (else they are dropped and the error says
// why); the highest slots drain. Another operation running gives ErrBusy.
func (s *Supervisor) Scale(n int, progress func(Event)) error {
	if n < 0 {
		return fmt.Errorf("workers: scale to %d: must be 0 or more", n)
	}
	if !s.op.TryLock() {
		return ErrBusy
	}
	defer s.op.Unlock()
	emit := s.emitter(progress)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrCanceled
	}
	old := s.spec
	spec := *old
	spec.Instances = n
	s.spec = &spec
	var added, gone []*slot
	for i := len(s.slots); i < n; i++ {
		sl := &slot{index: i, spec: &spec, backoff: spec.Restart.Backoff}
		s.slots = append(s.slots, sl)
		added = append(added, sl)
	}
	if n < len(s.slots) {
		gone = slices.Clone(s.slots[n:])
		s.slots = s.slots[:n]
	}
	prev := s.state
	if s.state == AppStopped {
		s.state = AppRunning
	}
	s.mu.Unlock()
	if len(added) > 0 {
		if err := s.replaceGroup(added, &spec, emit, "scale up"); err != nil {
			s.dropSlots(added)
			s.mu.Lock()
			s.spec, s.state = old, prev
			s.mu.Unlock()
			return fmt.Errorf("scale up: %w", err)
		}
	}
	s.drainSlots(gone, emit)
	s.ensureMonitor()
	return nil
}

// Pause stops every worker (stop signal, then SIGKILL after stop_timeout)
// and leaves the app stopped until Start or Scale. Another operation
// running gives ErrBusy.
func (s *Supervisor) Pause() error {
	if !s.op.TryLock() {
		return ErrBusy
	}
	defer s.op.Unlock()
	s.mu.Lock()
	s.state = AppStopping
	s.mu.Unlock()
	s.stopAll(Stopping)
	s.mu.Lock()
	s.state = AppStopped
	s.slots = nil
	s.mu.Unlock()
	return nil
}
