package workers

import "time"

// EventKind is what an Event reports.
type EventKind string

// Event kinds. A reload's progress callback gets started, ready, failed,
// cutover, draining and exited; subscribers get every kind.
const (
	EventStarted  EventKind = "started"  // a worker process was started
	EventReady    EventKind = "ready"    // a worker reported ready
	EventFailed   EventKind = "failed"   // a new worker did not get ready, or could not start
	EventServing  EventKind = "serving"  // a new worker took over its slot
	EventCutover  EventKind = "cutover"  // a blue-green generation took every position of the steering map at once
	EventNotice   EventKind = "notice"   // a note about the operation for the operator (Message)
	EventDraining EventKind = "draining" // a worker was told to stop and finish in-flight work
	EventExited   EventKind = "exited"   // a worker the supervisor stopped is gone
	EventCrash    EventKind = "crash"    // a worker exited on its own
	EventRestart  EventKind = "restart"  // a crashed worker's slot got a new worker
	EventErrored  EventKind = "errored"  // too many crashes: the app is errored, no more restarts
	EventReplace  EventKind = "replace"  // the monitor replaced a worker (max_memory, watchdog)
	EventState    EventKind = "state"    // the app's state changed (Message is the new AppState)
	EventSlots    EventKind = "slots"    // the number of slots changed (Message says to how many)
)

// Event is one state change of an app's pool. Its wire form belongs to the
// agent (agent/api).
type Event struct {
	Time    time.Time
	App     string
	Type    EventKind
	Slot    int
	PID     int    // of the worker, 0 for app-wide events
	Release string // the worker's (or the app's) release
	Millis  int64  // how long the step took: ready after start, drain
	Message string
}

// subscriberBuffer is how many events a subscriber may fall behind before
// it loses events.
const subscriberBuffer = 64

// subscriber is one Subscribe call; owned by the loop.
type subscriber struct{ ch chan Event }

// Subscribe returns a channel that gets every event of the app from now
// on, and a cancel func (safe to call twice, and concurrently) that closes
// it. Stop closes it too. The channel is buffered: a subscriber that falls
// more than subscriberBuffer events behind loses the events that do not fit
// (counted in Counters().DroppedEvents); the supervisor never waits for a
// subscriber.
func (s *Supervisor) Subscribe() (<-chan Event, func()) {
	sub := &subscriber{ch: make(chan Event, subscriberBuffer)}
	if !s.call(func(st *state) { st.subs[sub] = struct{}{} }) {
		close(sub.ch) // stopped: nothing more will happen
		return sub.ch, func() {}
	}
	cancel := func() {
		s.call(func(st *state) {
			if _, ok := st.subs[sub]; ok {
				delete(st.subs, sub)
				close(sub.ch)
			}
		})
	}
	return sub.ch, cancel
}

// publish hands e to every subscriber without waiting. Run by the loop.
func (st *state) publish(e Event) {
	for sub := range st.subs {
		select {
		case sub.ch <- e:
		default:
			st.ctr.DroppedEvents++
		}
	}
}

// closeSubs ends every subscription. Run by the loop when it stops.
func (st *state) closeSubs() {
	for sub := range st.subs {
		close(sub.ch)
		delete(st.subs, sub)
	}
}
