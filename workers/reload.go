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
	// stops every old one. On a steered pool the new workers wait as
	// spares and take every position in one update of the kernel's map
	// before any old one is told to stop (cutover, steer.go).
	BlueGreen Strategy = "blue-green"
)

// Reload moves the app to spec. Another operation running gives a
// *BusyError at once. It returns nil ("done") once every slot runs a ready
// worker of spec and no new worker exited before the end (the first batch
// also stayed up min_ready); it does not wait for the old workers' drains:
// each old worker gets its stop signal as soon as its replacement is
// ready, then drains in the background, bounded by stop_timeout, while
// the roll moves on (drain.go). Before it returns, every old worker has
// stopped accepting (awaitStopAccepting). progress may be nil; it gets the reload's
// started, ready, failed, draining and exited events (exited for the
// drains that end before the reload does; later ones go to subscribers
// only); calls to it never overlap and all happen before Reload returns,
// but old workers drain in their own goroutines, so a call may come from
// one of those.
func (s *Supervisor) Reload(spec *Spec, strategy Strategy, progress func(Event)) error {
	o, err := s.begin("reload to release "+spec.Release, progress)
	if err != nil {
		return err
	}
	defer o.end()
	var stopped bool
	var old *Spec
	var prev AppState
	var slots []*slot
	o.change(func(st *state) {
		old, prev, slots = st.spec, st.app, slices.Clone(st.slots)
		if st.app == AppStopped { // a stopped app stays stopped; it starts on spec later
			stopped = true
			s.changeStateTo(st, Event{Type: EventState, Release: spec.Release, Message: string(AppStopped)},
				func() { st.spec = spec })
			return
		}
		s.setApp(st, AppReloading, func() { st.spec = spec })
	})
	if stopped {
		return nil
	}
	start := time.Now() // for Counters
	err = o.reload(slots, old, spec, strategy)
	o.awaitStopAccepting()
	o.change(func(st *state) {
		st.ctr.reloaded(time.Since(start), err)
		switch {
		case st.closing:
		case err != nil:
			s.setApp(st, prev, func() { st.spec = old })
		default:
			s.setApp(st, AppRunning, func() {
				for _, sl := range st.slots {
					sl.crashes = nil
				}
			})
		}
	})
	return err
}

func (o *op) reload(slots []*slot, old, spec *Spec, strategy Strategy) error {
	keep := min(len(slots), spec.Instances)
	added := o.addSlots(len(slots), spec)
	todo := append(slices.Clone(slots[:keep]), added...)
	if _, err := o.rollOut(nil, todo, added, nil, old, spec, strategy, true); err != nil {
		return err
	}
	o.shrink(len(slots), spec)
	return nil
}

// addSlots appends the slots from..spec.Instances-1 a grow needs to the
// pool and returns them.
func (o *op) addSlots(from int, spec *Spec) []*slot {
	added := newSlots(from, spec.Instances, spec)
	if len(added) > 0 {
		o.publish(Event{Type: EventSlots, Release: spec.Release, Message: fmt.Sprint(spec.Instances)},
			func(st *state) { st.slots = append(st.slots, added...) })
	}
	return added
}

// shrink drains the slots past spec.Instances of a pool of n slots.
func (o *op) shrink(n int, spec *Spec) {
	if spec.Instances >= n {
		return
	}
	var gone []*slot
	o.publish(Event{Type: EventSlots, Release: spec.Release, Message: fmt.Sprint(spec.Instances)},
		func(st *state) { gone, st.slots = slices.Clone(st.slots[spec.Instances:]), st.slots[:spec.Instances] })
	o.drainSlots(gone, true)
}

// rollOut moves the slots of todo to spec, max_surge at a time (all at once
// for blue-green); with bake the first batch bakes min_ready. done are slots
// already on spec (a held canary) and started their new workers: a batch
// that fails, or a new worker of started that exits before the rollout
// ends, rolls every moved slot back to old, drops the added ones and
// returns an *AbandonedError. It returns every new worker, started's too.
func (o *op) rollOut(done, todo, added []*slot, started []*Worker, old, spec *Spec, strategy Strategy, bake bool) ([]*Worker, error) {
	batch := max(spec.MaxSurge, 1)
	if strategy == BlueGreen {
		batch = max(spec.Instances, 1)
	}
	done, started = slices.Clone(done), slices.Clone(started)
	for i := 0; i < len(todo); i += batch {
		group := todo[i:min(i+batch, len(todo))]
		// Only the first batch bakes: once the release has stayed up
		// min_ready, later batches swap at ready (an exit before the
		// reload ends still abandons it, exitedEarly below).
		wait := time.Duration(0)
		if i == 0 && bake {
			wait = spec.MinReady
		}
		news, err := o.replaceGroup(group, spec, wait, "", strategy == BlueGreen)
		if err == nil {
			// A new worker that exits before the reload ends abandons it:
			// its slot is rolled back with the others.
			done, started = append(done, group...), append(started, news...)
			err = exitedEarly(started)
		}
		if err != nil {
			if errors.Is(err, ErrCanceled) {
				return nil, err // shutting down: no rollback
			}
			return nil, o.abandonRollOut(err, done, added, old)
		}
	}
	return started, nil
}

// abandonRollOut rolls the slots of done back to old, drops the added ones
// and returns the *AbandonedError of err that says what serves now.
func (o *op) abandonRollOut(err error, done, added []*slot, old *Spec) *AbandonedError {
	abandoned := abandon(err)
	kept := slices.DeleteFunc(slices.Clone(done), func(sl *slot) bool { return slices.Contains(added, sl) })
	abandoned.RolledBack = o.rollback(kept, old)
	o.dropSlots(added)
	abandoned.Slots = o.slotReleases()
	abandoned.First = len(abandoned.Slots) == 0
	return abandoned
}

// slotReleases says which release each slot runs.
func (o *op) slotReleases() []SlotRelease {
	var out []SlotRelease
	o.change(func(st *state) {
		for _, sl := range st.slots {
			out = append(out, SlotRelease{Slot: sl.index, Release: sl.spec.Release})
		}
	})
	return out
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
func (o *op) rollback(done []*slot, spec *Spec) bool {
	ok := true
	for _, sl := range done {
		if _, err := o.replaceGroup([]*slot{sl}, spec, 0, "rollback", false); err != nil {
			o.s.log.Error("rollback of a slot failed; it keeps the new version", "worker", sl.index, "error", err)
			ok = false
		}
	}
	return ok
}

// replaceGroup starts a new worker on spec for every slot of group, waits
// until all are ready and have stayed up bake since, swaps them in (with
// together, on a steered pool, in one update of the kernel's map: cutover),
// then tells the old ones to stop and leaves them draining in the
// background; it returns the new workers. If one is not
// ready or exits before the swap, every new worker of the group is stopped
// and the old ones keep their slots. One that exits after the swap is the
// caller's to check (exitedEarly).
func (o *op) replaceGroup(group []*slot, spec *Spec, bake time.Duration, note string, together bool) ([]*Worker, error) {
	news, err := o.startNews(group, spec, note)
	if err == nil {
		var bad *Worker
		deadline := time.Now().Add(spec.ReadyTimeout)
		for _, w := range news {
			if err = o.s.waitReady(w, time.Until(deadline), spec); err != nil {
				bad = w
				break
			}
			// Stamped with the moment readiness arrived, the one the bake
			// below counts from, not the moment this loop got to it.
			after := w.ReadyAfter()
			o.step(Event{Type: EventReady, Time: w.Started.Add(after), Slot: w.Slot, PID: w.PID, Release: w.Release,
				Millis: after.Milliseconds(), Message: note}, func(st *state) { st.resample(o.s.fs, w) })
		}
		// The bake: readiness times differ, so waiting for each in turn
		// waits bake after the last ready one, not their sum.
		for _, w := range news {
			if err != nil {
				break
			}
			if err = stayUp(w, bake, o.s.cancel); err != nil {
				bad = w
			}
		}
		if bad != nil {
			o.step(Event{Type: EventFailed, Slot: bad.Slot, PID: bad.PID, Release: bad.Release, Message: err.Error()}, nil)
		}
	}
	if err != nil {
		o.stopNews(group, news)
		return nil, err
	}
	// The old workers drain in the background: each has its stop signal
	// (it stops accepting) before the next batch starts, but the roll does
	// not wait for its streams to end.
	for _, d := range o.swapIn(group, news, spec, note, together) {
		o.drainInBackground(d)
	}
	return news, nil
}

// startNews starts a worker on spec beside the current one of every slot
// of group; news[k] is group[k]'s. On error, news holds those started.
func (o *op) startNews(group []*slot, spec *Spec, note string) ([]*Worker, error) {
	news := make([]*Worker, 0, len(group))
	for _, sl := range group {
		w, err := spawn(o.s.args(), spec, sl.index)
		if err != nil {
			return news, fmt.Errorf("worker %d: %w", sl.index, err)
		}
		news = append(news, w)
		o.step(Event{Type: EventStarted, Slot: sl.index, PID: w.PID, Release: spec.Release, Message: note},
			func(st *state) { sl.extra = append(sl.extra, w); st.sampleOne(o.s.fs, w) })
	}
	return news, nil
}

// stopNews stops the new workers of a group that did not get ready.
func (o *op) stopNews(group []*slot, news []*Worker) {
	var wg sync.WaitGroup
	for k, w := range news {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stop(Stopping, o.s.log)
			o.publish(Event{Type: EventExited, Slot: w.Slot, PID: w.PID, Release: w.Release, Message: w.ExitDescription()},
				func(*state) {
					group[k].extra = slices.DeleteFunc(group[k].extra, func(x *Worker) bool { return x == w })
				})
		}()
	}
	wg.Wait()
}

// swapIn makes news[k] the current worker of group[k], all in one turn of
// the loop; it returns the drains of the workers they replace (none for a
// new slot), set aside in the same change, so that their exit is never
// taken for a crash. With together, a steered pool first switches the
// whole group in at once (cutover); otherwise each new worker takes its
// position as its slot changes (steerPool).
func (o *op) swapIn(group []*slot, news []*Worker, spec *Spec, note string, together bool) []*drain {
	var olds []*drain
	var c *cut
	o.s.call(func(st *state) {
		if together {
			c = o.s.cutover(st, group, news, spec.Release)
		}
		for k, sl := range group {
			nw := news[k]
			o.s.changeStateTo(st, Event{Type: EventServing, Slot: sl.index, PID: nw.PID, Release: spec.Release, Message: note},
				func() {
					sl.extra = slices.DeleteFunc(sl.extra, func(w *Worker) bool { return w == nw })
					if sl.cur != nil {
						olds = append(olds, st.drainAside(sl.cur))
					}
					sl.cur, sl.spec, sl.backoff = nw, spec, spec.Restart.Backoff
					o.s.watch(sl, nw)
				})
		}
		if c != nil {
			for w, n := range c.base {
				if st.connBase == nil {
					st.connBase = map[*Worker]uint64{}
				}
				st.connBase[w] = n
			}
		}
	})
	if c != nil {
		o.report(c.event)
	}
	return olds
}
