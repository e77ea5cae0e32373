package workers

import (
	"fmt"
	"slices"
)

// queueTicks is how many ticks in a row an accept queue must have stayed
// non-empty, never shrinking and grown overall, before it is warned about.
const queueTicks = 3

// queueWatch follows one listener's accept queue over ticks.
type queueWatch struct {
	first, last int // queue length when the rise began, and at the last tick
	ticks       int // ticks in a row with a non-empty, non-shrinking queue
	warning     string
}

// queueKey names a watched queue: a shared listener's (w nil), or a
// worker's own socket of a steered listener.
type queueKey struct {
	listen string
	w      *Worker
}

// checkQueues samples the accept queues (sampleQueues) and warns (agent
// log, Status) when one keeps growing: connections arrive and nobody
// accepts them. A shared listener's queue is watched whole (no worker of
// the app accepts: all stuck, or serving other sockets); a steered one's,
// per worker, since the kernel gives each worker its own queue and one
// stuck worker's grows while the others serve. The warning clears when the
// queue shrinks. Run by the loop every tick.
func (s *Supervisor) checkQueues(st *state) {
	s.sampleQueues(st)
	if st.queues == nil {
		st.queues = map[queueKey]*queueWatch{}
	}
	live := map[queueKey]bool{}
	for _, r := range st.queueReadings {
		if r.steered && r.w == nil {
			continue // the sum of the workers' queues: watched one by one
		}
		k := queueKey{r.listen, r.w}
		live[k] = true
		q := st.queues[k]
		if q == nil {
			q = &queueWatch{}
			st.queues[k] = q
		}
		n := r.queued
		switch {
		case n == 0 || n < q.last:
			if q.warning != "" {
				s.log.Info("accept queue drains again", "listen", r.listen, "queued", n)
			}
			*q = queueWatch{last: n}
			continue
		case q.ticks == 0:
			q.first = n
		}
		q.ticks++
		q.last = n
		if q.ticks >= queueTicks && n > q.first && q.warning == "" {
			q.warning = queueWarning(r)
			s.log.Warn("accept queue grows while no worker accepts", "listen", r.listen,
				"queued", n, "backlog", r.backlog, "pid", pidOf(r.w))
		}
	}
	for k := range st.queues {
		if !live[k] {
			delete(st.queues, k)
		}
	}
}

// queueWarning words the warning of a growing queue.
func queueWarning(r queueReading) string {
	if r.w == nil {
		return fmt.Sprintf("%s: %d connections wait in the accept queue (backlog %d) and the number grows: "+
			"no worker accepts them; check that the workers serve this listener and are not stuck", r.listen, r.queued, r.backlog)
	}
	return fmt.Sprintf("%s: %d connections wait in the accept queue of worker %d (pid %d; backlog %d) and the number grows: "+
		"the kernel steers connections to it and it does not accept them; check that it is not stuck", r.listen, r.queued,
		r.w.Slot, r.w.PID, r.backlog)
}

// pidOf is w's pid, 0 for none.
func pidOf(w *Worker) int {
	if w == nil {
		return 0
	}
	return w.PID
}

// queueWarnings lists the current accept-queue warnings.
func (st *state) queueWarnings() []string {
	var out []string
	for _, q := range st.queues {
		if q.warning != "" {
			out = append(out, q.warning)
		}
	}
	slices.Sort(out)
	return out
}
