package workers

import (
	"fmt"
	"hash/fnv"
	"time"
)

// tick samples every worker, then checks max_memory and the watchdog on
// that sample. Run by the loop every sampleInterval.
func (s *Supervisor) tick(st *state) {
	st.sampleAll(s.fs)
	s.checkQueues(st)
	if st.op != nil || st.closing || st.app == AppStopped || st.app == AppStopping {
		return // the next tick after the operation checks again
	}
	c, ok := s.overLimit(st)
	if !ok || s.canaryBreach(st, c) { // a canary's breach aborts its hold instead
		return
	}
	// The replacement is an operation like the others: a reload asked
	// meanwhile is told what runs.
	what := fmt.Sprintf("memory-limit replacement of worker %d", c.sl.index)
	switch c.why {
	case "watchdog":
		what = fmt.Sprintf("watchdog replacement of worker %d", c.sl.index)
	case "health":
		what = fmt.Sprintf("health-check replacement of worker %d", c.sl.index)
	case "recycle":
		what = fmt.Sprintf("%s replacement of worker %d", c.detail, c.sl.index) // recycle_after or recycle_at
	}
	o := s.newOp(what, "the "+c.why+" monitor", nil)
	st.op = o.info
	spec := c.sl.spec
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer o.end()
		o.replace(c, spec)
	}()
}

type overLimit struct {
	sl  *slot
	w   *Worker
	why string // "max_memory", "watchdog", "health" or "recycle"
	// detail is the event's message: why, and for health the last failure.
	detail string
}

// overLimit returns the first ready worker over max_memory, past its
// watchdog, or with health.failures failed liveness checks in a row; else
// the oldest worker due for recycling (recycle_after, recycle_at). Run by the loop.
func (s *Supervisor) overLimit(st *state) (overLimit, bool) {
	now := time.Now()
	var recycle overLimit
	for _, sl := range st.slots {
		w, spec := sl.cur, sl.spec
		if w == nil || w.State() != Ready {
			continue
		}
		if rss := st.usage[w].RSSBytes; spec.MaxMemory > 0 && rss > spec.MaxMemory {
			s.log.Warn("worker over max_memory; replacing it", "worker", sl.index, "pid", w.PID,
				"rss", rss, "max_memory", spec.MaxMemory)
			return overLimit{sl, w, "max_memory", "max_memory"}, true
		}
		if spec.Watchdog > 0 {
			last := w.lastWatchdog()
			if now.Sub(last) > spec.Watchdog {
				s.log.Warn("worker missed its watchdog; replacing it", "worker", sl.index, "pid", w.PID,
					"silent_for", now.Sub(last).Round(time.Millisecond), "watchdog", spec.Watchdog)
				return overLimit{sl, w, "watchdog", "watchdog"}, true
			}
		}
		if run, _ := w.healthFailures(); spec.Health != nil && run >= spec.Health.Failures {
			last := w.healthError()
			s.log.Warn("worker failed its health check; replacing it", "worker", sl.index, "pid", w.PID,
				"failures", run, "path", spec.Health.Path, "last", last)
			return overLimit{sl, w, "health", fmt.Sprintf("health: %d failed checks in a row, last: %s", run, last)}, true
		}
		// A held canary ends first: recycling waits (and never aborts it).
		if at, by := recycleAt(spec, w); st.hold == nil && !at.IsZero() && !now.Before(at) &&
			(recycle.w == nil || w.Started.Before(recycle.w.Started)) {
			recycle = overLimit{sl, w, "recycle", by}
		}
	}
	if recycle.w != nil {
		// The oldest due worker first: when recycles come faster than the
		// pool is gone through, the first slots must not starve the others.
		spec := recycle.sl.spec
		by := []any{"recycle_after", spec.RecycleAfter}
		if recycle.detail == "recycle_at" {
			by = []any{"recycle_at", spec.RecycleAtText}
		}
		s.log.Info("worker due for recycling; replacing it", append([]any{"worker", recycle.sl.index, "pid", recycle.w.PID,
			"up", now.Sub(recycle.w.Started).Round(time.Second)}, by...)...)
		return recycle, true
	}
	return overLimit{}, false
}

// replace replaces c's worker with a new one on spec, ready first.
func (o *op) replace(c overLimit, spec *Spec) {
	if _, err := o.replaceGroup([]*slot{c.sl}, spec, spec.MinReady, c.why, false); err != nil {
		o.s.log.Error("replacement did not get ready; the old worker stays", "worker", c.sl.index,
			"reason", c.why, "error", err)
		return
	}
	o.publish(Event{Type: EventReplace, Slot: c.sl.index, PID: c.w.PID, Release: spec.Release, Message: c.detail},
		func(*state) {
			switch c.why {
			case "max_memory":
				c.sl.memoryReplacements++
			case "watchdog":
				c.sl.watchdogReplacements++
			case "health":
				c.sl.healthReplacements++
			}
		})
}

// Schedule is a recycle_at schedule: Next is its first time after t
// (zero: none).
type Schedule interface{ Next(t time.Time) time.Time }

// recycleAt is when w falls due for recycling, and by which setting
// ("recycle_after" or "recycle_at"); zero when neither applies. The
// earlier of the two:
//
//   - recycle_after: it has run that long, plus up to a tenth more drawn
//     from its pid and start time, so that workers started together are
//     replaced one after the other;
//   - recycle_at: the schedule's first time after it started, the same
//     for a whole pool started before it (the monitor runs one
//     replacement at a time, the oldest worker first, a new one ready
//     first; a replacement starts after that time, so is not due again).
func recycleAt(spec *Spec, w *Worker) (time.Time, string) {
	if w.Started.IsZero() { // not known: never due (a zero start would be due at once)
		return time.Time{}, ""
	}
	var at time.Time
	by := ""
	if after := spec.RecycleAfter; after > 0 {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%d", w.PID, w.Started.UnixNano())
		jitter := time.Duration(h.Sum64() % uint64(after/10+1))
		at, by = w.Started.Add(after+jitter), "recycle_after"
	}
	if spec.RecycleAt != nil {
		// In the agent's zone (a schedule without CRON_TZ= is read in the
		// zone of the time given), whatever zone an adopted start came in.
		if next := spec.RecycleAt.Next(w.Started.In(time.Local)); !next.IsZero() && (at.IsZero() || next.Before(at)) {
			at, by = next, "recycle_at"
		}
	}
	return at, by
}
