package workers

import (
	"github.com/hashicorp/go-hclog"
)

// nodeTrapSource is the Node.js preload over the bind trap
// (listenerSource), for a Node.js app with no listen list
// (nodejs.Spec.Learn): the preload drains the app's servers and reports
// ready as for any node app, while the app's own bind of its listen(port)
// is answered by the agent (trapSource), whose policy (Spec.BindPolicy)
// decides which address the app may have and gives the socket it keeps
// for the app. So the address is learned from the bind of the real worker:
// no run of the app only to find it out. The preload's channel, the trap's
// notify fd and the shim come from the two ways; node always starts
// through the shim, which installs the trap.
type nodeTrapSource struct {
	nodeSource
	trapSource
}

func (s nodeTrapSource) prepare(st *sourceStart) error {
	if err := s.trapSource.prepare(st); err != nil {
		return err
	}
	if err := s.nodeSource.prepare(st); err != nil {
		st.closeChild()
		st.closeAgent()
		st.trap, st.agentEnd = nil, nil
		return err
	}
	return nil
}

func (s nodeTrapSource) started(w *Worker, log hclog.Logger, st *sourceStart) {
	s.trapSource.started(w, log, st)
}

// adopt takes both the preload's channel and the trap's notify fd.
func (nodeTrapSource) adopt(a spawnArgs, h *Handover, w *Worker, c *channels) {
	takeNode(h, c)
	takeTrap(a, h, w)
}

// describe: the preload, and what the trap answered.
func (s nodeTrapSource) describe(w *Worker) string {
	d := s.nodeSource.describe(w)
	if w.trap != nil {
		d += "; " + w.trap.describe()
	}
	return d
}
