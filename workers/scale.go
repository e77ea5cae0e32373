package workers

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Scale changes the number of serving workers to n (>= 0; the spec's
// spares come on top) on the current spec: new
// slots start and must get ready (else they are dropped and the error says
// why); the highest slots drain. Another operation running gives a
// *BusyError.
func (s *Supervisor) Scale(n int, progress func(Event)) error {
	if n < 0 {
		return fmt.Errorf("workers: scale to %d: must be 0 or more", n)
	}
	o, err := s.begin(fmt.Sprintf("scale to %d workers", n), progress)
	if err != nil {
		return err
	}
	defer o.end()
	var old, spec *Spec
	var prev AppState
	var added, gone []*slot
	o.change(func(st *state) {
		old, prev = st.spec, st.app
		ns := *old
		ns.Instances = n + old.Spares // n serving workers, and the spares
		spec = &ns
		total := ns.Instances
		added = newSlots(len(st.slots), total, spec)
		if total < len(st.slots) {
			gone = slices.Clone(st.slots[total:])
		}
		s.changeStateTo(st, Event{Type: EventSlots, Release: spec.Release, Message: fmt.Sprint(n)}, func() {
			st.spec = spec
			st.slots = append(st.slots[:min(total, len(st.slots))], added...)
			if st.app == AppStopped {
				st.app = AppRunning
			}
		})
	})
	if len(added) > 0 {
		news, err := o.replaceGroup(added, spec, spec.MinReady, "scale up", false)
		if err == nil {
			err = exitedEarly(news) // one that exits before the scale ends fails it
		}
		if err != nil {
			o.dropSlots(added)
			o.change(func(st *state) { s.setApp(st, prev, func() { st.spec = old }) })
			return fmt.Errorf("scale up: %w", err)
		}
	}
	o.drainSlots(gone, true)
	return nil
}

// dropSlots removes slots added by a failed grow; their workers are gone.
func (o *op) dropSlots(added []*slot) {
	if len(added) == 0 {
		return
	}
	o.drainSlots(added, false)
	o.publish(Event{Type: EventSlots, Message: "dropped the added slots"}, func(st *state) {
		st.slots = slices.DeleteFunc(st.slots, func(sl *slot) bool { return slices.Contains(added, sl) })
	})
}

// drainSlots stops the current workers of slots that are no longer part of
// the pool, in parallel; report sends their events to progress.
func (o *op) drainSlots(gone []*slot, report bool) {
	var wg sync.WaitGroup
	for _, sl := range gone {
		var w *Worker
		o.change(func(*state) { w = sl.cur })
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.quiet(o.s.log) // its slot left the steering map first (steerPool)
			o.stopWorker(sl, w, Draining, report)
		}()
	}
	wg.Wait()
}

// stopWorker stops w, a worker of sl, publishing draining (for a drain)
// and exited; report also sends them to progress. sl's current worker is
// moved aside first, so that its exit is not taken for a crash.
func (o *op) stopWorker(sl *slot, w *Worker, how State, report bool) {
	emit := o.publish
	if report {
		emit = func(e Event, change func(*state)) Event { o.step(e, change); return e }
	}
	aside := func(*state) {
		if sl.cur == w {
			sl.cur = nil
			sl.extra = append(sl.extra, w)
		}
	}
	var note string
	if how == Stopping {
		note = "stop"
	}
	emit(Event{Type: EventDraining, Slot: w.Slot, PID: w.PID, Release: w.Release, Message: note}, aside)
	t := time.Now()
	w.stop(how, o.s.log)
	emit(Event{Type: EventExited, Slot: w.Slot, PID: w.PID, Release: w.Release, Millis: time.Since(t).Milliseconds(),
		Message: w.stopDescription()}, func(st *state) {
		sl.extra = slices.DeleteFunc(sl.extra, func(x *Worker) bool { return x == w })
		delete(st.usage, w)
	})
}
