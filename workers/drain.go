package workers

import (
	"slices"
	"time"
)

// An old worker that an operation replaced drains in the background: the
// operation sends it its stop signal (it stops accepting) and moves on,
// so that a rolling reload over n workers with long-lived connections
// (streams, WebSockets) costs one drain at most, not n. The drain is
// bounded by the worker's stop_timeout, then its process group gets
// SIGKILL, as Worker.stop does. The worker then belongs to no slot: its
// exit, however it ends, is not a crash. Status shows it as draining until
// it is gone; Stop, Pause, Restart and Release wait for it (stopAll).

// drain is one background drain (state.draining); done is closed once the
// worker is gone and its exit published.
type drain struct {
	w    *Worker
	done chan struct{}
}

// drainAside moves w, no longer its slot's worker, to the background
// drains. Run by the loop, with the change that takes w out of its slot.
func (st *state) drainAside(w *Worker) *drain {
	d := &drain{w: w, done: make(chan struct{})}
	st.draining = append(st.draining, d)
	return d
}

// drainInBackground tells d's worker to stop and returns at once; a
// goroutine waits for the worker (killing its group at stop_timeout) and
// publishes its exit, reported to the operation's progress too while the
// operation runs.
func (o *op) drainInBackground(d *drain) {
	w := d.w
	o.step(Event{Type: EventDraining, Slot: w.Slot, PID: w.PID, Release: w.Release}, nil)
	t := time.Now()
	killAt := w.askStop(Draining)
	go func() {
		defer close(d.done)
		w.awaitStop(killAt)
		o.step(Event{Type: EventExited, Slot: w.Slot, PID: w.PID, Release: w.Release,
			Millis: time.Since(t).Milliseconds(), Message: w.ExitDescription()}, func(st *state) {
			st.draining = slices.DeleteFunc(st.draining, func(x *drain) bool { return x == d })
			delete(st.usage, w)
		})
	}()
}

// drainingWorkers lists the workers draining in the background.
func (st *state) drainingWorkers() []*Worker {
	ws := make([]*Worker, 0, len(st.draining))
	for _, d := range st.draining {
		ws = append(ws, d.w)
	}
	return ws
}
