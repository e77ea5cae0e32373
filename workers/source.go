package workers

import (
	"maps"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
)

// How a worker gets its listeners. There are three ways, one type each,
// and spawn, adopt and status call them through listenerSource without
// asking which:
//
//   - inheritedSource: the listeners are fds 3, 4, ... with LISTEN_FDS
//     (systemd socket activation); the app takes them itself.
//   - nodeSource (node.go): the Node.js preload maps node's listen() onto
//     copies of them at nodejs.FirstFD+1.., reports on its own channel,
//     and may start node without the exec shim.
//   - trapSource (bindtrap.go): the exec shim installs a seccomp filter
//     and the agent answers the app's own bind of a configured address by
//     placing its socket at the app's fd.
//   - nodeTrapSource (nodetrap.go): both, for a Node.js app with no listen
//     list: the preload drains and reports, the trap answers the bind of
//     the address the agent's policy allows (learned from that bind).
//
// sourceOf picks one per spec. Which sockets a worker gets (the shared
// ones, or its own in a steered pool: workerListeners) and whether it
// needs the quiet phase before its stop signal (ownSockets) are the
// balance's, not the source's: every way works with every balance.
type listenerSource interface {
	// prepare adds this way's files, environment and start mode to one
	// start. On error it leaves nothing open.
	prepare(st *sourceStart) error
	// started begins what answers the worker now that it runs; st's
	// agent-side ends are w's from now on.
	started(w *Worker, log hclog.Logger, st *sourceStart)
	// adopt takes what crossed a handoff in h for this way (into c, or
	// onto w) and closes what belongs to another way.
	adopt(a spawnArgs, h *Handover, w *Worker, c *channels)
	// describe says how w got its listeners, for status. Called with w.mu
	// held: it takes only leaf locks.
	describe(w *Worker) string
}

// Beside listenerSource, small optional interfaces for a way that needs
// more (nomad's optional hook interfaces, caddy's Provisioner): serve and
// the drain look for them with a type assertion.

// sourceReader is a way with a channel of its own that the agent reads
// while the worker runs (the preload's sd_notify lines).
type sourceReader interface {
	// reader names the channel and how to read it (f nil: none for w).
	reader(w *Worker, c *channels, log hclog.Logger) (name string, f *os.File, read func(*sync.WaitGroup, *os.File))
}

// sourceStopper is a way whose worker is more than its main process: the
// app may run under a launcher (npm start) that does not pass the stop
// signal on.
type sourceStopper interface {
	// stopsGroup reports whether w's stop signal goes to its process group.
	stopsGroup(w *Worker) bool
	// awaitGone waits, once w's main process exited, until the app is
	// gone too (bounded).
	awaitGone(w *Worker)
}

// sourceHandoff is a way whose worker holds a file of the way's own
// (not one of its channels) that crosses an agent handoff: the bind
// trap's notify fd. adopt takes it back on the other side.
type sourceHandoff interface {
	// handoff names the file and gives the agent's copy (not to be
	// closed: the sender's own), nil when w has none.
	handoff(w *Worker) (name string, f *os.File)
}

// sourceOf is the one place that chooses how the workers of spec get
// their listeners. The Node.js preload maps node's listen() itself, so it
// comes before the bind trap.
func sourceOf(spec *Spec) listenerSource {
	switch {
	case spec != nil && spec.Node != nil && spec.BindTrap:
		return nodeTrapSource{}
	case spec != nil && spec.Node != nil:
		return nodeSource{}
	case spec != nil && spec.BindTrap:
		return trapSource{}
	}
	return inheritedSource{}
}

// sourceStart is one start as a listener source sees it: what it reads
// (spec, the worker's listeners, its channels, its pinning) and what it
// adds to the handoff.Proc.
type sourceStart struct {
	spec *Spec
	ls   []handoff.Bound // the worker's listeners (workerListeners)
	c    *channels
	cpu  int // the CPU the worker is pinned to, -1 for none

	env      []string
	fixed    []handoff.FixedFile
	direct   bool
	exec     string
	trap     *os.File       // the shim's end of the bind trap's pair
	agentEnd *os.File       // the agent's end of it, until started
	kept     map[string]int // fds the worker keeps besides the channels'
}

// apply puts what the source added into hp and the worker's kept fds.
func (st *sourceStart) apply(hp *handoff.Proc, kept map[string]int) {
	hp.Env, hp.Fixed, hp.Direct, hp.Exec, hp.Trap = st.env, st.fixed, st.direct, st.exec, st.trap
	maps.Copy(kept, st.kept)
}

// closeChild closes the worker's ends once it started (or failed to).
func (st *sourceStart) closeChild() {
	if st.trap != nil {
		st.trap.Close()
	}
}

// closeAgent closes the agent's ends after a failed start.
func (st *sourceStart) closeAgent() {
	if st.agentEnd != nil {
		st.agentEnd.Close()
	}
}

// inheritedSource passes the listeners as fds 3, 4, ... (handoff.Proc
// does that for every way); nothing more.
type inheritedSource struct{}

func (inheritedSource) prepare(*sourceStart) error                  { return nil }
func (inheritedSource) started(*Worker, hclog.Logger, *sourceStart) {}
func (inheritedSource) adopt(_ spawnArgs, h *Handover, _ *Worker, _ *channels) {
	dropStreams(h, nodeStream, trapStream)
}

func (inheritedSource) describe(w *Worker) string {
	if w.spec != nil && len(w.spec.Listeners) > 0 {
		return "inherited fd"
	}
	return ""
}

// dropStreams closes what crossed in h under names: a way the worker's
// spec no longer has.
func dropStreams(h *Handover, names ...string) {
	for _, n := range names {
		if f := h.files[n]; f != nil {
			f.Close()
		}
	}
}

// socketSource says how w got its listeners, for status. Called with w.mu
// held: the sources take only leaf locks.
func (w *Worker) socketSource() string { return sourceOf(w.spec).describe(w) }
