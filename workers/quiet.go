package workers

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/sockdiag"
)

// Quiet before the stop signal. A worker that accepts on a socket of its
// own (a steered pool; a bind the agent answered, ownsock.go) holds
// connections nobody else can take: those the kernel queued for it and
// those it accepted but has not read. Most servers' own shutdown (uvicorn,
// Go's http.Server.Shutdown) closes both, and the client of each gets a
// reset for a request the app never saw. So the drain of such a worker
// first waits, out of the rotation already (the steering map no longer
// points at its socket), until the kernel says it holds nothing waiting —
// its accept queue empty, and none of its connections accepted but never
// answered (the kept-alive ones with a request in flight are counted, not
// waited for) — or the
// spec's QuietTimeout passes, or the worker is gone; only then does it
// get its stop signal. Idle kept-alive connections are the app's to close
// (counted, not waited for). A worker of a shared socket needs none of
// this: one accept queue, which the other workers go on taking from.

// quietPoll is how often the quiet phase asks the kernel (no event tells
// when a queue runs dry).
const quietPoll = 5 * time.Millisecond

// quietOutcome is how a quiet phase ended.
type quietOutcome string

const (
	quietDone    quietOutcome = "quiet"   // nothing waited any more
	quietGrace   quietOutcome = "grace"   // QuietTimeout passed first
	quietGone    quietOutcome = "gone"    // the worker exited
	quietUnknown quietOutcome = "unknown" // the kernel's tables or /proc could not be read
)

// quietReport is what a quiet phase saw last and how long it took.
type quietReport struct {
	Outcome quietOutcome
	Waited  time.Duration
	// Queued are the connections in the worker's accept queues; Unread,
	// those it accepted and never answered; Unanswered, kept-alive ones
	// with a request in flight (unread bytes, or a request newer than
	// their last answer); Idle, kept-alive ones waiting for nothing.
	Queued, Unread, Unanswered, Idle int
	Err                              error
}

// waiting reports whether anything the report counts is still waited for.
// A kept-alive connection with a request in flight is not waited for:
// under a steady keep-alive load there always is one, so the phase would
// last its whole grace, and the app's own drain is the one that can
// answer it (measured: uvicorn's stops took 1.5-2.3 s at the median, 5 of
// 20 the full 5 s, and new connections lost none either way).
func (r quietReport) waiting() bool { return r.Queued+r.Unread > 0 }

// ownSockets reports whether the workers of spec accept on sockets of
// their own, the one case where a stopping worker can drop connections
// another could have served: the way a worker gets its listeners
// (workerListeners) decides how it is drained.
func ownSockets(spec *Spec) bool { return len(steeredGroups(spec)) > 0 }

// quiet is the quiet phase of w's drain (see above): it returns at once
// for a worker on a shared socket or with QuietTimeout 0. w shows as
// draining from its start. Run by the operation, before askStop.
func (w *Worker) quiet(log hclog.Logger) {
	if w.spec.QuietTimeout <= 0 || !ownSockets(w.spec) {
		return
	}
	w.setState(Draining)
	r := awaitQuiet(func() []int { return processTree(w.PID) }, listenerPorts(w.spec), w.spec.QuietTimeout, w.exited)
	args := []any{"worker", w.Slot, "pid", w.PID, "outcome", r.Outcome, "waited_ms", r.Waited.Milliseconds(),
		"idle_kept_alive", r.Idle, "unanswered", r.Unanswered}
	switch r.Outcome {
	case quietGrace:
		log.Warn("quiet_timeout passed with connections still waiting; stop signal sent", append(args,
			"queued", r.Queued, "unread", r.Unread)...)
	case quietUnknown:
		log.Warn("cannot tell what the worker holds; stop signal sent without a quiet phase", append(args, "error", r.Err)...)
	default:
		log.Info("quiet before the stop signal", args...)
	}
}

// awaitQuiet waits until the processes tree names hold nothing waiting on
// ports (see quietReport), grace passes, or gone is closed; it returns what
// it saw last.
func awaitQuiet(tree func() []int, ports map[uint16]bool, grace time.Duration, gone <-chan struct{}) quietReport {
	start := time.Now()
	limit := time.NewTimer(grace)
	defer limit.Stop()
	tick := time.NewTicker(quietPoll)
	defer tick.Stop()
	for {
		r := quietNow(tree(), ports)
		r.Waited = time.Since(start)
		if r.Outcome == quietUnknown || !r.waiting() {
			return r
		}
		select {
		case <-gone:
			r.Outcome = quietGone
			return r
		case <-limit.C:
			r.Outcome, r.Waited = quietGrace, time.Since(start)
			return r
		case <-tick.C:
		}
	}
}

// quietNow counts what pids hold on ports, from one dump of the kernel's
// listening and established TCP sockets (with tcp_info) matched by inode
// to pids' descriptors.
func quietNow(pids []int, ports map[uint16]bool) quietReport {
	held := map[uint64]bool{}
	for k, p := range pids {
		inos, err := sockdiag.Inodes(p)
		if k == 0 && err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return quietReport{Outcome: quietGone}
			}
			return quietReport{Outcome: quietUnknown, Err: fmt.Errorf("read the worker's descriptors: %w", err)}
		}
		for ino := range inos {
			held[ino] = true
		}
	}
	socks, err := sockdiag.TCPInfo([]sockdiag.State{sockdiag.Listen, sockdiag.Established},
		func(s *sockdiag.Socket) bool { return ports[s.Local.Port()] && held[s.Inode] })
	if err != nil {
		return quietReport{Outcome: quietUnknown, Err: err}
	}
	r := quietReport{Outcome: quietDone}
	for _, s := range socks {
		switch {
		case s.State == sockdiag.Listen:
			r.Queued += int(s.RecvQ)
		case s.Info == nil || s.Info.DataSegsOut == 0:
			r.Unread++ // never answered: the app may not have seen it
		case s.RecvQ > 0 || s.Info.LastDataRecv < s.Info.LastDataSent:
			r.Unanswered++ // kept alive, a request in flight: the app's own drain answers it
		default:
			r.Idle++
		}
	}
	return r
}
