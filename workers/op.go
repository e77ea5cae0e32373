package workers

import (
	"sync"
	"time"
)

// opInfo is the operation that runs (state.op). Its fields are set by the
// loop; done is closed when the operation has ended.
type opInfo struct {
	what, by string
	since    time.Time
	done     chan struct{}
}

func (o *opInfo) busy(app string) *BusyError {
	return &BusyError{App: app, Op: o.what, Since: o.since, By: o.by}
}

// op is a running operation, driven from its own goroutine: every state
// change it makes is a request to the loop.
type op struct {
	s        *Supervisor
	info     *opInfo
	progress func(Event) // guarded by mu; nil once the operation ended
	mu       sync.Mutex  // serializes progress: drains report concurrently
	// drains are the old workers the operation set draining; only its
	// own goroutine touches them.
	drains []*drain
}

// begin admits an operation: a *BusyError when one runs, ErrCanceled after
// Stop. The caller must call end.
func (s *Supervisor) begin(what string, progress func(Event)) (*op, error) {
	o := s.newOp(what, "", progress)
	var err error
	ok := s.call(func(st *state) {
		switch {
		case st.closing:
			err = ErrCanceled
		case st.op != nil:
			err = st.op.busy(s.opts.App)
		case st.hold != nil:
			err = st.hold.refusal(s.opts.App)
		default:
			st.op, st.lastHold = o.info, nil
		}
	})
	if !ok {
		return nil, ErrCanceled
	}
	if err != nil {
		return nil, err
	}
	return o, nil
}

func (s *Supervisor) newOp(what, by string, progress func(Event)) *op {
	return &op{s: s, progress: progress,
		info: &opInfo{what: what, by: by, since: time.Now(), done: make(chan struct{})}}
}

// end lets the next operation in: first a held canary's automatic end
// that waited for this one. The progress callback gets nothing after it
// (a background drain's exit is only published).
func (o *op) end() {
	// Whatever the operation (reload, scale, a canary's promote or abort),
	// it returns once only the workers it kept take new connections.
	o.awaitStopAccepting()
	o.mu.Lock()
	o.progress = nil
	o.mu.Unlock()
	o.s.call(func(st *state) {
		if st.op == o.info {
			st.op = nil
			o.s.startDue(st)
		}
	})
	close(o.info.done)
}

// change runs fn in the loop; fn changes the state only through the door.
// An operation ends before the loop does (Stop waits for it).
func (o *op) change(fn func(*state)) { o.s.call(fn) }

// publish applies change through the door and publishes e to subscribers.
func (o *op) publish(e Event, change func(*state)) Event {
	var out Event
	o.s.call(func(st *state) {
		var fn func()
		if change != nil {
			fn = func() { change(st) }
		}
		out = o.s.changeStateTo(st, e, fn)
	})
	return out
}

// step is publish, and also reports e to the operation's progress callback.
func (o *op) step(e Event, change func(*state)) {
	o.report(o.publish(e, change))
}

// report hands e, published already, to the operation's progress callback.
func (o *op) report(e Event) {
	if e.Time.IsZero() { // the loop has ended: stamp it here
		e.Time, e.App = time.Now(), o.s.opts.App
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.progress != nil {
		o.progress(e)
	}
}
