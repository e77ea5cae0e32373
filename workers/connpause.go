package workers

import (
	"errors"
	"fmt"
	"time"

	"github.com/deployd/deployd/handoff"
)

// A connection pause (kamal-proxy's pause, without a proxy): new
// connections of a steered app go to a hold socket in the reuseport group
// that nobody accepts on, and wait in its accept queue, handshake done;
// the workers go on with the connections they have. Resume (or the pause's
// maximum) sends new connections to the workers again and closes the hold
// socket, whose queued connections the kernel then hands to the workers in
// order (request migration): none is refused. The queue holds up to the
// listen backlog (net.core.somaxconn); past it, clients' SYNs wait for a
// retransmit as with any full queue. The agent is the only holder of the
// hold socket: an agent upgrade or stop resumes.

// ErrPauseNeedsSteering refuses a pause of an app whose listeners are shared.
var ErrPauseNeedsSteering = errors.New(`workers: pause needs balance = "even" or "sticky" (kernel steering); this app's listeners are shared`)

// connPause is a pause in effect (state.connPause).
type connPause struct {
	since, until time.Time // until is zero without a maximum
	holds        []*handoff.Listener
	timer        *time.Timer
}

// PauseStatus describes a connection pause.
type PauseStatus struct {
	Since time.Time
	// Until is when it ends by itself (zero: at ResumeConnections).
	Until time.Time
	// Queued is how many connections wait, Backlog how many can.
	Queued, Backlog int
}

// PauseConnections makes new connections wait in the kernel until
// ResumeConnections, or until max has passed (max > 0). Pausing a paused
// app changes its maximum. ErrPauseNeedsSteering for a shared app.
func (s *Supervisor) PauseConnections(max time.Duration) error {
	var err error
	if !s.call(func(st *state) { err = s.pauseConnections(st, max) }) {
		return ErrCanceled
	}
	return err
}

func (s *Supervisor) pauseConnections(st *state, max time.Duration) error {
	switch {
	case st.closing:
		return ErrCanceled
	case len(steeredGroups(st.spec)) == 0:
		return ErrPauseNeedsSteering
	}
	p := st.connPause
	if p == nil {
		p = &connPause{since: time.Now()}
		for _, b := range st.spec.Listeners {
			if b.Steered() == nil {
				continue
			}
			h, err := b.Member()
			if err == nil {
				fd, _ := h.Fd()
				if err = b.Steered().Group.Hold(fd); err != nil {
					h.Close()
				}
			}
			if err != nil {
				unhold(st, p, s)
				return fmt.Errorf("pause %s %s: %w", b.Network, b.Address, err)
			}
			p.holds = append(p.holds, h)
		}
		st.connPause = p
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer, p.until = nil, time.Time{}
	}
	if max > 0 {
		p.until = time.Now().Add(max)
		p.timer = time.AfterFunc(max, func() {
			s.send(func(st *state) {
				if st.connPause == p {
					s.log.Info("connections resumed: the pause's maximum passed", "max", max)
					s.resumeConnections(st)
				}
			})
		})
	}
	s.log.Info("connections paused: new ones wait in the kernel", "max", max)
	return nil
}

// ResumeConnections ends a pause: the connections that waited are served
// first, in order, then new ones. Resuming an app that is not paused does
// nothing.
func (s *Supervisor) ResumeConnections() {
	s.call(func(st *state) {
		if st.connPause != nil {
			s.log.Info("connections resumed")
			s.resumeConnections(st)
		}
	})
}

func (s *Supervisor) resumeConnections(st *state) {
	p := st.connPause
	st.connPause = nil
	if p.timer != nil {
		p.timer.Stop()
	}
	unhold(st, p, s)
}

// unhold points new connections at the workers again, then closes the
// hold sockets: their queues move to the workers. Run by the loop.
func unhold(st *state, p *connPause, s *Supervisor) {
	for _, g := range steeredGroups(st.spec) {
		if err := g.Unhold(); err != nil {
			s.log.Error("resume: cannot unhold", "error", err)
		}
	}
	for _, h := range p.holds {
		h.Close()
	}
}

// status of the pause, nil when none.
func (p *connPause) status() *PauseStatus {
	if p == nil {
		return nil
	}
	ps := &PauseStatus{Since: p.since, Until: p.until}
	for _, h := range p.holds {
		q, b, _ := h.AcceptQueue()
		ps.Queued += q
		ps.Backlog += b
	}
	return ps
}
