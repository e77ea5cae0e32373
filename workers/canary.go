package workers

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// A canary is a reload that stops after its first N slots: the app holds
// (AppCanary), old and new releases serving side by side, until Promote
// rolls the rest or Abort puts the canaries back on the old release. The
// hold is a state of the app, not an operation: during it the loop hears
// exits and ticks as always, status reads it, and every other operation is
// refused with a *HoldError. It ends by itself (an operation the
// supervisor starts, like a max_memory replacement) when a canary crashes
// or breaches a monitor limit (abort), or after the Canary's Timeout (its
// Action).

// CanaryAction is how a hold ends at its timeout.
type CanaryAction string

// Canary actions.
const (
	CanaryAbort   CanaryAction = "abort"
	CanaryPromote CanaryAction = "promote"
)

// Canary asks ReloadCanary for a hold.
type Canary struct {
	N int // slots 0..N-1 move to the new spec; 1 <= N < the workers kept
	// Timeout, when > 0, ends the hold by itself with Action.
	Timeout time.Duration
	Action  CanaryAction
	// OnEnd, when set, is called once when the hold ends (however it
	// ends), from the goroutine of the operation that ends it, before the
	// next operation is admitted. It must not call the supervisor's
	// operations (Status and the like are fine).
	OnEnd func(CanaryEnd)
}

// CanaryOutcome is how a hold ended.
type CanaryOutcome string

// Canary outcomes.
const (
	CanaryPromoted CanaryOutcome = "promoted" // every slot runs the new release
	CanaryAborted  CanaryOutcome = "aborted"  // the canaries went back to the old release
	// CanaryFailed: the promote was abandoned (a new worker was not ready
	// or exited); every slot went back to the old release (Err says
	// whether the rollback restored them all).
	CanaryFailed CanaryOutcome = "failed"
)

// CanaryEnd says how a hold ended.
type CanaryEnd struct {
	Outcome           CanaryOutcome
	Release, Previous string
	// By is what ended it: "promote", "abort" (asked), "canary_timeout",
	// "crash", or the monitor ("max_memory", "watchdog", ...).
	By string
	// Reason says why a hold ended by itself.
	Reason string
	// Err is an *AbandonedError when a slot could not be moved back (an
	// abort or a failed promote whose rollback was incomplete), or the
	// promote's abandon; nil otherwise.
	Err  error
	Held time.Duration
	At   time.Time
}

// CanaryStatus is a hold, in AppStatus.
type CanaryStatus struct {
	Release, Previous string
	Slots             []int // the canary slots
	Since             time.Time
	Timeout           time.Duration
	Action            CanaryAction
	// Ending says what ends the hold now ("abort: worker 0 crashed"), ""
	// while it holds.
	Ending string
}

// ErrNoCanary matches (errors.Is) every *NoCanaryError.
var ErrNoCanary = errors.New("workers: no canary is held")

// ErrBadCanary is returned, nothing changed, for a canary that cannot be
// held (too many or too few workers, a stopped app).
var ErrBadCanary = errors.New("workers: bad canary")

// HoldError refuses an operation while a canary is held; it matches ErrBusy.
type HoldError struct {
	App               string
	Release, Previous string
	Slots             []int
	Since             time.Time
}

func (e *HoldError) Error() string {
	return fmt.Sprintf("workers: %s holds a canary of release %s on worker(s) %v beside %s since %s; promote or abort it first",
		e.App, e.Release, e.Slots, e.Previous, e.Since.Format(time.TimeOnly))
}

// Is makes errors.Is(err, ErrBusy) true.
func (e *HoldError) Is(target error) bool { return target == ErrBusy }

// NoCanaryError answers Promote or Abort when no canary is held; Last is
// how the last hold ended, nil when there was none since the last operation.
type NoCanaryError struct {
	App  string
	Last *CanaryEnd
}

func (e *NoCanaryError) Error() string {
	msg := fmt.Sprintf("workers: %s holds no canary", e.App)
	if l := e.Last; l != nil {
		msg += fmt.Sprintf("; the last one (release %s) was %s at %s by %s", l.Release, l.Outcome, l.At.Format(time.TimeOnly), l.By)
		if l.Reason != "" {
			msg += ": " + l.Reason
		}
	}
	return msg
}

// Is makes errors.Is(err, ErrNoCanary) true.
func (e *NoCanaryError) Is(target error) bool { return target == ErrNoCanary }

// hold is a held canary (state.hold). Owned by the loop.
type hold struct {
	old, spec *Spec
	canaries  []*slot
	workers   []*Worker // the canaries' new workers: one that exits fails a promote
	strategy  Strategy
	since     time.Time
	c         Canary
	timer     *time.Timer // canary_timeout, nil without
	// due is an automatic end waiting for the running operation to end.
	due *autoEnd
}

type autoEnd struct {
	action     CanaryAction
	by, reason string
}

func (h *hold) status() *CanaryStatus {
	cs := &CanaryStatus{Release: h.spec.Release, Previous: h.old.Release, Since: h.since,
		Timeout: h.c.Timeout, Action: h.c.Action}
	for _, sl := range h.canaries {
		cs.Slots = append(cs.Slots, sl.index)
	}
	if h.due != nil {
		cs.Ending = string(h.due.action) + ": " + h.due.reason
	}
	return cs
}

func (h *hold) refusal(app string) *HoldError {
	cs := h.status()
	return &HoldError{App: app, Release: cs.Release, Previous: cs.Previous, Slots: cs.Slots, Since: h.since}
}

func (h *hold) stopTimer() {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
}

// Holding returns the refusal a held canary gives other operations, nil
// when none is held.
func (s *Supervisor) Holding() *HoldError {
	var e *HoldError
	s.read(func(st *state) {
		if st.hold != nil {
			e = st.hold.refusal(s.opts.App)
		}
	})
	return e
}

// ReloadCanary is Reload that moves only slots 0..c.N-1 (readiness-gated,
// the first batch bakes min_ready), then holds: it returns nil once the
// hold starts. A canary that does not get ready abandons it as a reload
// (*AbandonedError, old release serving). A canary that cannot be held
// returns an error matching ErrBadCanary and changes nothing.
func (s *Supervisor) ReloadCanary(spec *Spec, strategy Strategy, c Canary, progress func(Event)) error {
	o, err := s.begin("canary of release "+spec.Release, progress)
	if err != nil {
		return err
	}
	defer o.end()
	var old *Spec
	var prev AppState
	var slots []*slot
	o.change(func(st *state) {
		old, prev, slots = st.spec, st.app, slices.Clone(st.slots)
		if err = canaryFits(st, spec, c.N); err == nil {
			s.setApp(st, AppReloading, func() { st.spec = spec })
		}
	})
	if err != nil {
		return err
	}
	start := time.Now()
	canaries := slots[:c.N]
	ws, err := o.rollOut(nil, canaries, nil, nil, old, spec, strategy, true)
	o.change(func(st *state) {
		switch {
		case st.closing:
		case err != nil:
			st.ctr.reloaded(time.Since(start), err)
			s.setApp(st, prev, func() { st.spec = old })
		default:
			h := &hold{old: old, spec: spec, canaries: canaries, workers: ws, strategy: strategy,
				since: time.Now(), c: c}
			if c.Timeout > 0 {
				h.timer = time.AfterFunc(c.Timeout, func() {
					s.send(func(st *state) {
						s.holdDue(st, h, autoEnd{c.Action, "canary_timeout", fmt.Sprintf("canary_timeout %s passed", c.Timeout)})
					})
				})
			}
			s.setApp(st, AppCanary, func() { st.hold = h })
			s.log.Info("canary held", "release", spec.Release, "previous", old.Release, "workers", c.N,
				"timeout", c.Timeout, "action", c.Action)
		}
	})
	return err
}

// canaryFits checks that a canary of n slots can be held. Run by the loop.
// CanaryFits says whether a canary of n workers on spec could hold now
// (an error wrapping ErrBadCanary if not), so that a caller can refuse a bad
// --canary before it changes anything (a deploy's install and before
// hook). ReloadCanary checks again.
func (s *Supervisor) CanaryFits(spec *Spec, n int) error {
	var err error
	s.read(func(st *state) { err = canaryFits(st, spec, n) })
	return err
}

func canaryFits(st *state, spec *Spec, n int) error {
	keep := min(len(st.slots), spec.Instances)
	switch {
	case st.app == AppStopped:
		return fmt.Errorf("%w: the app is stopped; start it first", ErrBadCanary)
	case keep < 2:
		return fmt.Errorf("%w: a canary needs at least 2 workers (one on each release); the app runs %d", ErrBadCanary, keep)
	case n < 1 || n >= keep:
		return fmt.Errorf("%w: a canary of %d workers: use 1 to %d (of the %d the app keeps), so that the old release serves beside it",
			ErrBadCanary, n, keep-1, keep)
	}
	return nil
}

// Promote rolls the rest of the held canary's slots to its release (the
// reload's strategy, readiness-gated; min_ready was baked by the canary)
// and ends the hold. A promote that fails rolls every slot back, canaries
// too (CanaryFailed). Without a hold it returns a *NoCanaryError.
func (s *Supervisor) Promote(progress func(Event)) (CanaryEnd, error) {
	o, h, err := s.beginHeld("promote of the canary", progress)
	if err != nil {
		return CanaryEnd{}, err
	}
	defer o.end()
	return o.promote(h, "promote", ""), nil
}

// Abort puts the held canary's slots back on the previous release,
// readiness-gated, and ends the hold. Without a hold it returns a
// *NoCanaryError.
func (s *Supervisor) Abort(progress func(Event)) (CanaryEnd, error) {
	o, h, err := s.beginHeld("abort of the canary", progress)
	if err != nil {
		return CanaryEnd{}, err
	}
	defer o.end()
	return o.abort(h, "abort", ""), nil
}

// beginHeld admits an operation that ends the hold: a *NoCanaryError when
// there is none, a *BusyError when an operation runs (an automatic end).
func (s *Supervisor) beginHeld(what string, progress func(Event)) (*op, *hold, error) {
	o := s.newOp(what, "", progress)
	var h *hold
	var err error
	ok := s.call(func(st *state) {
		switch {
		case st.closing:
			err = ErrCanceled
		case st.op != nil:
			err = st.op.busy(s.opts.App)
		case st.hold == nil:
			err = &NoCanaryError{App: s.opts.App, Last: st.lastHold}
		default:
			h, st.op = st.hold, o.info
		}
	})
	if !ok {
		return nil, nil, ErrCanceled
	}
	if err != nil {
		return nil, nil, err
	}
	return o, h, nil
}

func (o *op) promote(h *hold, by, reason string) CanaryEnd {
	var slots []*slot
	o.change(func(st *state) {
		h.stopTimer()
		slots = slices.Clone(st.slots)
		o.s.setApp(st, AppReloading, nil)
	})
	start := time.Now()
	keep := min(len(slots), h.spec.Instances)
	rest := slices.DeleteFunc(slices.Clone(slots[:keep]), func(sl *slot) bool { return slices.Contains(h.canaries, sl) })
	added := o.addSlots(len(slots), h.spec)
	_, err := o.rollOut(h.canaries, append(rest, added...), added, h.workers, h.old, h.spec, h.strategy, false)
	if err == nil {
		o.shrink(len(slots), h.spec)
	}
	end := CanaryEnd{Outcome: CanaryPromoted, By: by, Reason: reason, Err: err}
	if err != nil {
		end.Outcome = CanaryFailed
	}
	o.change(func(st *state) { st.ctr.reloaded(time.Since(start), err) })
	return o.endHold(h, end, false) // every slot got a new worker: errored or not before
}

func (o *op) abort(h *hold, by, reason string) CanaryEnd {
	errored := false
	o.change(func(st *state) {
		h.stopTimer()
		errored = st.app == AppErrored // a slot the abort does not touch crash-looped during the hold
		o.s.setApp(st, AppReloading, nil)
	})
	end := CanaryEnd{Outcome: CanaryAborted, By: by, Reason: reason}
	if !o.rollback(h.canaries, h.old) {
		why := "abort"
		if reason != "" {
			why += ": " + reason
		}
		end.Err = &AbandonedError{Reason: errors.New(why), Slots: o.slotReleases()}
	}
	return o.endHold(h, end, errored)
}

// endHold ends hold h with end: the app runs again (on the new spec when
// promoted, else the old one), unless errored (a slot the end left alone
// crash-looped during the hold) or a slot crash-looped during the end: it
// stays errored then, until a restart. A canary slot left without a live
// worker (its crash aborted the hold and its rollback failed) is
// restarted, and OnEnd hears it before the next operation is admitted.
func (o *op) endHold(h *hold, end CanaryEnd, errored bool) CanaryEnd {
	end.Release, end.Previous, end.At = h.spec.Release, h.old.Release, time.Now()
	end.Held = end.At.Sub(h.since)
	s := o.s
	o.change(func(st *state) {
		if st.hold != h {
			return
		}
		st.hold, st.lastHold = nil, &end
		if st.closing {
			return
		}
		next := AppRunning
		if errored || st.app == AppErrored {
			next = AppErrored
		}
		s.setApp(st, next, func() {
			if end.Outcome != CanaryPromoted {
				st.spec = h.old
			}
		})
		for _, sl := range h.canaries {
			if w := sl.cur; w != nil && sl.timer == nil && st.live(sl) && w.State() == Exited {
				s.restartSlot(st, sl, w)
			}
		}
	})
	s.log.Info("canary ended", "outcome", end.Outcome, "by", end.By, "reason", end.Reason,
		"release", end.Release, "previous", end.Previous, "held", roundDuration(end.Held))
	if h.c.OnEnd != nil {
		h.c.OnEnd(end)
	}
	return end
}

// holdDue asks for an automatic end of hold h; an abort wins over a
// timeout's promote. It starts at once when no operation runs, else when
// the running one ends (op.end). Run by the loop.
func (s *Supervisor) holdDue(st *state, h *hold, e autoEnd) {
	if st.hold != h || st.closing {
		return
	}
	if h.due == nil || e.action == CanaryAbort {
		h.due = &e
	}
	s.startDue(st)
}

// startDue starts the held canary's due automatic end when no operation
// runs. Run by the loop.
func (s *Supervisor) startDue(st *state) {
	h := st.hold
	if h == nil || h.due == nil || st.op != nil || st.closing || st.handover != nil {
		return
	}
	e := *h.due
	what := "canary " + string(e.action)
	o := s.newOp(what, "the "+e.by, nil)
	st.op = o.info
	s.log.Warn("canary ends by itself", "action", e.action, "by", e.by, "reason", e.reason, "release", h.spec.Release)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer o.end()
		if e.action == CanaryPromote {
			o.promote(h, e.by, e.reason)
		} else {
			o.abort(h, e.by, e.reason)
		}
	}()
}

// canaryCrash handles the crash of w, sl's worker, during a hold: a canary's
// crash aborts the hold. It reports true when the abort replaces the slot's
// worker (no restart then); when an operation runs, the slot restarts as
// usual and the abort follows that operation. Run by the loop.
func (s *Supervisor) canaryCrash(st *state, sl *slot, w *Worker, desc string) bool {
	h := st.hold
	if h == nil || !slices.Contains(h.canaries, sl) {
		return false
	}
	idle := st.op == nil
	s.holdDue(st, h, autoEnd{CanaryAbort, "crash", fmt.Sprintf("canary worker %d (pid %d) crashed: %s", sl.index, w.PID, desc)})
	return idle
}

// canaryBreach handles a monitor limit breach (max_memory, watchdog, or
// any other reason a replacement names) during a hold: a canary's breach
// aborts the hold instead of a replacement; it reports whether it did.
// Run by the loop, before a replacement starts.
func (s *Supervisor) canaryBreach(st *state, c overLimit) bool {
	h := st.hold
	if h == nil || !slices.Contains(h.canaries, c.sl) {
		return false
	}
	s.holdDue(st, h, autoEnd{CanaryAbort, c.why, fmt.Sprintf("canary worker %d (pid %d) breached %s", c.sl.index, c.w.PID, c.why)})
	return true
}
