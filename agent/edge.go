package agent

import (
	"net"
	"sync"
)

// An Edge serves the agent to its clients; the agent runs it in its run
// group.
type Edge interface {
	// Serve serves until Stop; it returns nil when Stop ended it.
	Serve() error
	// Stop stops accepting, answers what was accepted (bounded), and
	// returns once Serve has. Safe to call twice.
	Stop()
}

// edge builds the edge that serves ctl (and the metrics listener); without
// Options.Edge, one that holds ctl until stopped.
func (a *Agent) edge(ctl net.Listener) Edge {
	if a.newEdge != nil {
		metrics := a.metrics
		a.metrics = nil // the edge's now
		return a.newEdge(a, ctl, metrics, a.log)
	}
	return &heldSocket{ln: ctl, stop: make(chan struct{})}
}

// heldSocket is the edge of an agent without one: the control socket stays
// open, unanswered, until Stop.
type heldSocket struct {
	ln   net.Listener
	once sync.Once
	stop chan struct{}
}

func (h *heldSocket) Serve() error { <-h.stop; return nil }

func (h *heldSocket) Stop() {
	h.once.Do(func() {
		h.ln.Close()
		close(h.stop)
	})
}
