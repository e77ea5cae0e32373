package workers

import (
	"fmt"
	"slices"

	"github.com/deployd/deployd/handoff"
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

// checkQueues samples the accept queue of each of the app's listeners and
// warns (agent log, Status) when one keeps growing: connections arrive and
// no worker of the app accepts them (all stuck, or serving other sockets).
// The warning clears when the queue shrinks. Run by the loop every tick.
func (s *Supervisor) checkQueues(st *state) {
	if st.queues == nil {
		st.queues = map[*handoff.Listener]*queueWatch{}
	}
	var live []*handoff.Listener
	for _, b := range st.spec.Listeners {
		l := b.Listener
		n, backlog, ok := l.AcceptQueue()
		if !ok {
			continue
		}
		live = append(live, l)
		q := st.queues[l]
		if q == nil {
			q = &queueWatch{}
			st.queues[l] = q
		}
		switch {
		case n == 0 || n < q.last:
			if q.warning != "" {
				s.log.Info("accept queue drains again", "listen", l.Network+" "+l.Address, "queued", n)
			}
			*q = queueWatch{last: n}
			continue
		case q.ticks == 0:
			q.first = n
		}
		q.ticks++
		q.last = n
		if q.ticks >= queueTicks && n > q.first && q.warning == "" {
			q.warning = fmt.Sprintf("%s %s: %d connections wait in the accept queue (backlog %d) and the number grows: "+
				"no worker accepts them; check that the workers serve this listener and are not stuck", l.Network, l.Address, n, backlog)
			s.log.Warn("accept queue grows while no worker accepts", "listen", l.Network+" "+l.Address,
				"queued", n, "backlog", backlog)
		}
	}
	for l := range st.queues {
		if !slices.Contains(live, l) {
			delete(st.queues, l)
		}
	}
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
