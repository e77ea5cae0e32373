package workers

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/handoff/bindtrap"
)

// trapReceive bounds the wait for the shim's notify fd: the shim sends it
// before it execs the app, a few milliseconds after the start.
const trapReceive = 10 * time.Second

// workerTrap answers the binds of one worker (Spec.BindTrap): its own
// bind of a configured address takes the agent's socket (handoff/bindtrap).
// Its goroutine owns the trap; mu guards what status and a handoff read.
type workerTrap struct {
	listens []bindtrap.Listen
	done    chan struct{} // closed when the goroutine ended

	mu       sync.Mutex
	notify   *os.File       // the agent's copy of the notify fd, nil until received
	trap     *bindtrap.Trap // nil until received
	closed   bool
	answered map[string]bool // listen names answered at least once
	shared   bool            // the last answer placed a socket every worker shares
	// ownBefore: adopted holding a socket of its own that an earlier
	// agent's answer gave it.
	ownBefore bool
}

// trapListens are the sockets a worker's binds are answered with: its own
// in a steered pool (ls from workerListeners), else the listeners' (for
// which a bind gets a socket of its own where it can: ownsock.go). TCP
// only, each with its real port (a configured port 0 has one now).
func trapListens(ls []handoff.Bound) []bindtrap.Listen {
	var out []bindtrap.Listen
	for _, b := range ls {
		if b.Network == "unix" {
			continue
		}
		addr, err := b.LocalAddr()
		if err != nil {
			continue
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			continue
		}
		out = append(out, bindtrap.Listen{Addr: ap, Sock: b.Listener, Name: b.Name})
	}
	return out
}

// startTrap answers w's binds: from pair (a new worker: the shim sends the
// notify fd on it; pair is closed once read) or notify (an adopted
// worker's, owned from now on). With ReadyBind, w is ready once every
// listen was answered.
func (w *Worker) startTrap(log hclog.Logger, spec *Spec, ls []handoff.Bound, pair, notify *os.File) {
	t := &workerTrap{listens: trapListens(ls), done: make(chan struct{}), answered: map[string]bool{}}
	w.trap = t
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.With("pid", w.PID)
	go func() {
		defer close(t.done)
		if pair != nil {
			var err error
			notify, err = bindtrap.Receive(pair, trapReceive)
			pair.Close()
			if err != nil {
				log.Warn("the worker's binds are not answered: no notify fd from its shim (its stderr says why)", "error", err)
				return
			}
		}
		match := bindtrap.Match(t.listens)
		if spec.BindPolicy != nil {
			match = spec.BindPolicy(t.listens)
		}
		decide := func(r bindtrap.Request) bindtrap.Decision {
			d := match(r)
			if d.Errno != 0 && d.Refused != "" {
				w.refuse(d.Refused)
			}
			if d.Sock != nil {
				name := d.Name
				own := w.ownSocket(&d, log) // a socket of its own (ownsock.go)
				shared := slices.ContainsFunc(spec.Listeners, func(b handoff.Bound) bool { return b.Listener == d.Sock })
				d.Placed = func() {
					own.placed()
					t.placedShared(shared)
					if t.answer(name) && spec.Ready.Mode == ReadyBind {
						// The socket is the app's now; the connections
						// that queue before its accept are served once
						// it runs.
						w.markReady()
					}
				}
			}
			return d
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			notify.Close()
			return
		}
		t.notify, t.trap = notify, bindtrap.Serve(notify, decide, log.Named("bindtrap"))
		t.mu.Unlock()
	}()
}

// refuse records why the agent refused a bind of w, for status and for
// the error that says why w was not ready.
func (w *Worker) refuse(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refused, w.status = why, "bind refused: "+why
}

// refusal is why the agent refused a bind of w ("" for none).
func (w *Worker) refusal() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
}

// answer records that the listen named name was answered, and reports
// whether every listen has been.
func (t *workerTrap) answer(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.answered[name] = true
	for _, l := range t.listens {
		if !t.answered[l.Name] {
			return false
		}
	}
	return true
}

// placedShared records whether the last answer placed a shared socket
// (else the worker's own), for status.
func (t *workerTrap) placedShared(shared bool) {
	t.mu.Lock()
	t.shared = shared
	t.mu.Unlock()
}

// adoptedOwn records that the adopted worker holds a socket of its own.
func (t *workerTrap) adoptedOwn() {
	t.mu.Lock()
	t.ownBefore = true
	t.mu.Unlock()
}

// file is the agent's copy of the notify fd for a handoff (the sender's
// own: not to be closed), nil when not received.
func (t *workerTrap) file() *os.File {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.notify
}

// describe says how the worker got its sockets, for status.
func (t *workerTrap) describe() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.trap == nil {
		return "bind trap: waiting for the shim"
	}
	ans, seen := t.trap.Answered()
	n := 0
	for _, c := range ans {
		n += c
	}
	if n == 0 && t.ownBefore {
		return "answered bind (before this agent; a socket of its own)"
	}
	if n == 0 {
		return fmt.Sprintf("inherited fd (bind trap: none of %d binds named a listen)", seen)
	}
	whose := "a socket of its own"
	if t.shared {
		whose = "the shared socket"
	}
	return fmt.Sprintf("answered bind (%d of %d binds took the agent's socket; %s)", n, seen, whose)
}

// close stops answering once the worker exited. Safe on nil and twice.
func (t *workerTrap) close() {
	if t == nil {
		return
	}
	<-t.done
	t.mu.Lock()
	t.closed = true
	tr := t.trap
	t.mu.Unlock()
	if tr != nil {
		tr.Close()
	}
}

// adoptTrapFile makes a notify fd that crossed a handoff (or was copied
// out of the worker) pollable for the trap; f is closed.
func adoptTrapFile(f *os.File) (*os.File, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	nfd, derr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3) }); err != nil {
		derr = err
	}
	f.Close()
	if derr != nil {
		return nil, fmt.Errorf("the bind trap's notify fd: %w", derr)
	}
	return bindtrap.NotifyFile(nfd)
}

// trapStream names the notify fd of a worker's bind trap in a Handover
// and in its kept fds.
const trapStream = "bind"

// trapSource is the bind the agent answers (listenerSource): the exec
// shim gets one end of a socketpair at hp.Trap, sends the seccomp notify
// fd on it before it execs the app, and the worker keeps that fd at
// handoff.TrapFD for the agent after a crash or an upgrade. The shim is
// always used: a Direct start has none to install the filter.
type trapSource struct{}

func (trapSource) prepare(st *sourceStart) error {
	agentEnd, child, err := bindtrap.Pair()
	if err != nil {
		return err
	}
	st.trap, st.agentEnd, st.direct = child, agentEnd, false
	st.kept = map[string]int{trapStream: handoff.TrapFD}
	return nil
}

// started answers the worker's binds from the agent's end of the pair.
func (trapSource) started(w *Worker, log hclog.Logger, st *sourceStart) {
	w.startTrap(log, st.spec, st.ls, st.agentEnd, nil)
	st.agentEnd = nil
}

// adopt answers the binds of an adopted worker with the notify fd that
// crossed with it. In a steered pool a bind it makes from now on gets a
// socket of its own (ownsock.go).
func (trapSource) adopt(a spawnArgs, h *Handover, w *Worker, _ *channels) {
	dropStreams(h, nodeStream)
	takeTrap(a, h, w)
}

// takeTrap answers the binds of an adopted worker with the notify fd
// that crossed in h, if any.
func takeTrap(a spawnArgs, h *Handover, w *Worker) {
	f := h.files[trapStream]
	if f == nil {
		return
	}
	nf, err := adoptTrapFile(f)
	if err != nil {
		if a.log != nil {
			a.log.Warn("an adopted worker's binds are not answered", "pid", h.PID, "error", err)
		}
		return
	}
	w.startTrap(a.log, w.spec, w.spec.Listeners, nil, nf)
	if holdsOwnListener(h.PID, w.spec) {
		w.trap.adoptedOwn()
	}
}

// handoff gives the notify fd to the next agent, which answers the
// worker's binds from then on (adopt).
func (trapSource) handoff(w *Worker) (string, *os.File) { return trapStream, w.trap.file() }

// describe: how many of the worker's binds took the agent's socket; a
// worker whose trap never started got its fds as any other.
func (trapSource) describe(w *Worker) string {
	if w.trap != nil {
		return w.trap.describe()
	}
	return inheritedSource{}.describe(w)
}

// identityReady is the ready mode as Spec.Identity names it: "bind" is
// "notify" with one more way to be ready, and an app that took the
// default ready before binds were answered had "notify": its workers are
// the same and are adopted across the upgrade that brings the trap.
func identityReady(m ReadyMode) string {
	if m == ReadyBind {
		return string(ReadyNotify)
	}
	return string(m)
}
