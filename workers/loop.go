package workers

import (
	"slices"
	"time"
)

// state is everything a supervisor knows about its pool. It is owned by
// the loop (Supervisor.run): only functions the loop runs read or write
// it. Other goroutines hand the loop a function (call, send); operations
// run in their caller's goroutine and ask the loop for every state change,
// so that their long steps (readiness waits, drains) never keep the loop
// from hearing worker exits, ticks and status requests. Once the loop has
// ended (after Stop), the state is frozen and read directly.
type state struct {
	spec      *Spec
	slots     []*slot
	app       AppState
	lastExit  string
	lastLines []string
	// op is the running operation, nil when none: a second one is refused
	// with a *BusyError that names it.
	op *opInfo
	// claim is the caller's operation that spans several calls, nil when
	// none (claim.go): a second claim is refused.
	claim *opInfo
	// hold is the held canary, nil when none (canary.go); lastHold says how
	// the last one ended, until the next operation begins.
	hold     *hold
	lastHold *CanaryEnd
	// closing is set by Stop: no new operation, no crash restart.
	closing bool
	ctr     Counters
	// usage holds the CPU/RSS sample of each worker, taken once per tick.
	usage map[*Worker]sample
	// queueReadings are the accept queues read at the last tick, and
	// queues follows each over ticks (acceptq.go, queue.go);
	// queueDumpFailed: the last dump of steered sockets failed (logged once).
	queueReadings   []queueReading
	queues          map[queueKey]*queueWatch
	queueDumpFailed bool

	subs map[*subscriber]struct{}
	// handover is set between HandOver and Resume/Release; handedOver,
	// once released, are the workers the next agent has: never stopped here.
	handover   *handover
	handedOver map[*Worker]bool
	// adopted are the workers Adopt took from the previous agent and
	// leftovers those it did not (stopped by StopLeftovers).
	adopted   map[*Worker]bool
	leftovers []*Worker
	// draining are the old workers replaced by an operation and left to
	// drain in the background (drain.go); they belong to no slot.
	draining []*drain
	// steerActive is the slot count last given to the kernel's steering
	// (steer.go); connPause is the connection pause, nil when none
	// (connpause.go).
	steerActive int
	connPause   *connPause
	// pos gives the steering map's positions to slots (steer.go); a slot
	// without one is a spare. connBase is the position's connection count
	// when each worker took it.
	pos      map[*slot]int
	connBase map[*Worker]uint64
}

type slot struct {
	index   int       // immutable: read without the loop
	spec    *Spec     // the version this slot should run
	cur     *Worker   // nil when none runs
	extra   []*Worker // new workers not yet swapped in, old ones stopping
	backoff time.Duration
	// timer is the pending crash restart, nil when none; restartAt is
	// when it is due (an agent upgrade hands it over).
	timer     *time.Timer
	restartAt time.Time
	// restarts counts crash restarts of this slot; crashes are the recent
	// ones, within the restart window (max_restarts applies per slot, as
	// PM2's does per process, so one event that kills every worker does not
	// error the app).
	restarts int
	crashes  []time.Time
	// replacements by the monitor.
	memoryReplacements, watchdogReplacements, healthReplacements int
}

// request is a message to the loop: fn runs in the loop; done, when not
// nil, is the reply channel, closed after fn ran.
type request struct {
	fn   func(*state)
	done chan struct{}
}

// run is the loop: the one goroutine that owns the state.
func (s *Supervisor) run() {
	defer close(s.done)
	tick := time.NewTicker(sampleInterval)
	defer tick.Stop()
	for {
		select {
		case r := <-s.reqs:
			r.fn(&s.st)
			if r.done != nil {
				close(r.done)
			}
		case <-tick.C:
			s.tick(&s.st)
		case <-s.quit:
			return
		}
	}
}

// call runs fn in the loop and waits until it ran. It reports false,
// without running fn, once the loop has ended. fn must not block nor call
// call or send.
func (s *Supervisor) call(fn func(*state)) bool {
	r := request{fn: fn, done: make(chan struct{})}
	select {
	case s.reqs <- r:
	case <-s.done:
		return false
	}
	<-r.done
	return true
}

// send hands fn to the loop without waiting for it to run (worker exits,
// timers). It reports false once the loop has ended.
func (s *Supervisor) send(fn func(*state)) bool {
	select {
	case s.reqs <- request{fn: fn}:
		return true
	case <-s.done:
		return false
	}
}

// read runs fn, which only reads, in the loop, or on the frozen state once
// the loop has ended.
func (s *Supervisor) read(fn func(*state)) {
	if !s.call(fn) {
		fn(&s.st)
	}
}

// changeStateTo is the one door through which the state changes
// (supervisord's changeStateTo): run by the loop, it applies change (nil:
// the event changes nothing the supervisor keeps, e.g. a worker's own
// readiness) and publishes e to every subscriber. It returns e as
// published, with the time (now, unless e says when it happened) and the
// app.
func (s *Supervisor) changeStateTo(st *state, e Event, change func()) Event {
	if change != nil {
		change()
	}
	s.steerPool(st)
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.App = s.opts.App
	s.log.Debug("event", "event", e.Type, "worker", e.Slot, "pid", e.PID, "release", e.Release,
		"ms", e.Millis, "message", e.Message)
	st.publish(e)
	switch e.Type {
	case EventStarted, EventRestart, EventExited, EventCrash, EventReady:
		if s.opts.Changed != nil {
			s.opts.Changed()
		}
	}
	return e
}

// setApp moves the app to state to through the door, applying change with
// it. An app that goes errored publishes EventErrored, others EventState.
func (s *Supervisor) setApp(st *state, to AppState, change func()) {
	kind := EventState
	if to == AppErrored {
		kind = EventErrored
	}
	s.changeStateTo(st, Event{Type: kind, Release: st.spec.Release, Message: string(to)}, func() {
		st.app = to
		if change != nil {
			change()
		}
	})
}

// newSlots returns n fresh slots from index from on spec.
func newSlots(from, n int, spec *Spec) []*slot {
	out := make([]*slot, 0, max(n-from, 0))
	for i := from; i < n; i++ {
		out = append(out, &slot{index: i, spec: spec, backoff: spec.Restart.Backoff})
	}
	return out
}

// live reports whether sl is still one of the pool's slots.
func (st *state) live(sl *slot) bool { return slices.Contains(st.slots, sl) }

// workers lists every worker of the pool: current ones and those being
// started, stopped or drained.
func (st *state) workers() []*Worker {
	var ws []*Worker
	for _, sl := range st.slots {
		if sl.cur != nil {
			ws = append(ws, sl.cur)
		}
		ws = append(ws, sl.extra...)
	}
	return append(ws, st.drainingWorkers()...)
}
