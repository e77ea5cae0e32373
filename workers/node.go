package workers

import (
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/logs"
	"github.com/deployd/deployd/workers/nodejs"
)

// nodeStart is what a node worker gets besides a plain one: the preload's
// channel at fd nodejs.FirstFD and a second copy of every listener after it
// (the copies reach node through npm and sh; fds 3.. stay as for any app),
// then a copy of the health listener when the app has health checks.
type nodeStart struct {
	ch    *handoff.IPCChannel
	fixed []handoff.FixedFile
	env   []string
}

// prepareNode verifies the preload file (rewriting it if it was changed)
// and builds the channel, fds and env for one start of a node worker;
// direct: node starts without the exec shim (the preload sets LISTEN_PID).
func prepareNode(spec *Spec, env []string, health *os.File, direct bool) (*nodeStart, error) {
	if err := spec.Node.Preload.Repair(); err != nil {
		return nil, err
	}
	ch, err := handoff.NewIPCChannel()
	if err != nil {
		return nil, err
	}
	n := &nodeStart{ch: ch}
	n.fixed = append(n.fixed, handoff.FixedFile{At: nodejs.FirstFD, Fd: ch.Child.Fd()})
	for i, l := range spec.Listeners {
		fd, err := l.Fd()
		if err != nil {
			closeFiles(ch.Parent, ch.Child)
			return nil, err
		}
		n.fixed = append(n.fixed, handoff.FixedFile{At: nodejs.FirstFD + 1 + i, Fd: fd})
	}
	if health != nil { // the health listener's copy follows the listeners'
		n.fixed = append(n.fixed, handoff.FixedFile{At: nodejs.FirstFD + 1 + len(spec.Listeners), Fd: health.Fd()})
	}
	if direct {
		n.env = spec.Node.DirectEnv(env, nodejs.FirstFD, nodejs.FirstFD+1)
	} else {
		n.env = spec.Node.Env(env, nodejs.FirstFD, nodejs.FirstFD+1)
	}
	return n, nil
}

// nodeStream names the preload's channel in a Handover and in a
// worker's kept fds.
const nodeStream = "node"

// nodeSource is the Node.js preload (listenerSource): node's listen()
// takes the agent's socket at nodejs.FirstFD+1.., the preload reports on
// its own channel (readNode), and node itself (not npm & co.), unpinned,
// starts without the exec shim: the preload sets LISTEN_PID.
type nodeSource struct{}

func (nodeSource) prepare(st *sourceStart) error {
	if !st.spec.Node.Indirect && st.cpu < 0 && !st.spec.BindTrap { // the trap needs the shim
		st.exec, st.direct = handoff.ExecPath(st.spec.Argv[0], st.env, st.spec.Dir)
	}
	own := *st.spec
	own.Listeners = st.ls
	n, err := prepareNode(&own, st.env, st.c.health, st.direct)
	if err != nil {
		return err
	}
	st.c.node, st.env, st.fixed = n, n.env, n.fixed
	return nil
}

func (nodeSource) started(*Worker, hclog.Logger, *sourceStart) {}

// adopt takes the preload's channel that crossed with h; serve reads it.
func (nodeSource) adopt(_ spawnArgs, h *Handover, _ *Worker, c *channels) {
	takeNode(h, c)
	dropStreams(h, trapStream)
}

// takeNode takes the preload's channel that crossed with h into c.
func takeNode(h *Handover, c *channels) {
	if f := h.files[nodeStream]; f != nil {
		c.node = &nodeStart{ch: &handoff.IPCChannel{Parent: f}}
	}
}

// reader reads the preload's channel (readNode) while the worker runs.
func (nodeSource) reader(w *Worker, c *channels, log hclog.Logger) (string, *os.File, func(*sync.WaitGroup, *os.File)) {
	if c.node == nil {
		return "", nil, nil // an adopted worker whose channel did not cross
	}
	w.node = &nodeWorker{done: make(chan struct{}), grace: w.spec.StopTimeout, indirect: w.spec.Node.Indirect}
	return nodeStream, c.node.ch.Parent, func(wg *sync.WaitGroup, f *os.File) { w.readNode(wg, f, w.spec.Ready, log) }
}

// stopsGroup: through npm & co. the stop signal goes to the process
// group (nodeWorker).
func (nodeSource) stopsGroup(w *Worker) bool { return w.node != nil && w.node.indirect }

// awaitGone waits until the app's node closed the preload's channel too.
func (nodeSource) awaitGone(w *Worker) {
	if w.node != nil {
		w.node.await(w.unit)
	}
}

func (nodeSource) describe(w *Worker) string {
	if w.node != nil {
		return "node preload"
	}
	return inheritedSource{}.describe(w)
}

// readNode reads the preload's sd_notify lines until EOF (every process
// holding the channel has exited). LISTEN= counts for nothing: the address
// an app's code asks for is its bind's (bindtrap.go). READY=1 counts only with ready = "notify",
// NODE_IPC=ready only with ready = "node-ipc"; ERROR= becomes the worker's
// status, which status shows.
//
// LOG= is what the preload itself did (a drain begun, cut short); it goes
// to the agent's log under the worker, never to the app's own log.
func (w *Worker) readNode(wg *sync.WaitGroup, f *os.File, ready ReadyPolicy, log hclog.Logger) {
	defer wg.Done()
	defer close(w.node.done)
	w.pz.run("node", func(pending []byte) ([]byte, error) {
		return logs.CaptureFrom(f, pending, handoff.MaxNotifyMessage, func(line string) {
			msg := handoff.ParseNotify([]byte(line))
			if ready.Mode != ReadyNotify {
				delete(msg, "READY")
			}
			if ready.Mode == ReadyNodeIPC && msg["NODE_IPC"] == "ready" {
				msg["READY"] = "1" // process.send('ready') of an app under npm start
			}
			delete(msg, "LISTEN") // an old preload's; the address comes from the bind now
			if v, ok := msg["LOG"]; ok {
				if log != nil {
					log.Info("node preload", "worker", w.Slot, "pid", w.PID, "did", v)
				}
				delete(msg, "LOG")
			}
			if e, ok := msg["ERROR"]; ok {
				msg["STATUS"] = strings.TrimPrefix(e, "deployd: ")
			}
			w.onNotify(msg)
		})
	})
}

// nodeWorker is the node side of a Worker. Through `npm start` the main
// process is npm, which on SIGTERM kills its `sh -c` and exits at once, while
// the app's node (a grandchild) would never hear of it. So for a command
// that starts node underneath (indirect), the stop signal goes to the whole
// process group, and the worker counts as gone only when the app's node has
// closed the preload's channel too.
type nodeWorker struct {
	done     chan struct{} // closed at EOF of the channel: every holder exited
	grace    time.Duration // bounds the wait for the channel after the main process exited
	indirect bool
}

// nodeUnitPoll is how often await looks whether a process of the unit
// still runs: the channel may be held open by a process outside it (one
// the app passed it to), whose copy must not hold up the stop.
const nodeUnitPoll = 50 * time.Millisecond

// await waits until the channel is closed by every process, at most grace,
// and no longer than some process of the worker's unit u (nil: none known)
// runs. With node as the main process its exit is the app's: no wait.
func (n *nodeWorker) await(u *procunit.Unit) {
	if !n.indirect {
		return
	}
	t := time.NewTimer(max(n.grace, time.Second))
	defer t.Stop()
	tick := time.NewTicker(nodeUnitPoll)
	defer tick.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			return
		case <-tick.C:
			if u != nil && len(u.Procs()) == 0 {
				return
			}
		}
	}
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// ignoreListen drops a LISTEN= that came on NOTIFY_SOCKET, which any
// process of the worker can reach: the address an app's code asks for is
// the one its own bind names, seen by the agent through the bind trap,
// and is judged even then (never a line a process writes). It warns once
// (*warned).
func ignoreListen(log hclog.Logger, msg handoff.Notify, pid int, warned *bool) {
	v, ok := msg["LISTEN"]
	if !ok {
		return
	}
	delete(msg, "LISTEN")
	if log != nil && !*warned {
		*warned = true
		log.Warn("ignored LISTEN= on NOTIFY_SOCKET: the address an app listens on is the one its own bind asks for",
			"pid", pid, "listen", v)
	}
}
