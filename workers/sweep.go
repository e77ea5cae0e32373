package workers

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/internal/failpoint"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/internal/sockdiag"
)

// A worker's process group is not all it may leave behind: a child that
// calls setsid (a daemonizing library, `nohup setsid`) leaves the group
// and its session, and would live on after the worker with the listening
// sockets and output pipes it inherited — serving the old release after a
// reload. Each worker therefore runs as a procunit unit (a cgroup of its
// own under the agent's, or its process group plus a sweep of /proc for
// its marker variable), and once its main process is gone, whatever is
// left in the unit is killed and named in the log. The unit's Record
// crosses with the worker to the next agent (Handover, Process), which
// finds it again; an upgrade never removes or empties it.

// sweepTimeout bounds the kill of what a worker left running.
const sweepTimeout = 5 * time.Second

// sweep kills what the worker left running once its main process exited
// (exitedAt), before it is reaped (wait), and logs each process it killed.
func (w *Worker) sweep(log hclog.Logger, exitedAt time.Time) {
	es, swept := w.beginSweep()
	defer close(swept)
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	left := killEscaped(ctx, es)
	u := w.groupUnit()
	w.kernelSaid(log, u.Stats())
	more, err := u.End(ctx)
	cancel()
	left = append(left, more...)
	if log == nil {
		return
	}
	cause := "crash"
	if s := w.State(); s == Draining || s == Stopping {
		cause = "stop"
	}
	for _, p := range left {
		log.Warn("worker exited and left a process running; killed it", "worker", w.Slot,
			"worker_pid", w.PID, "pid", p.PID, "command", p.Name, "cause", cause,
			"tracked_by", u.Mode(), "after", time.Since(exitedAt).Round(time.Microsecond))
	}
	if len(left) > 0 && cause == "crash" {
		log.Warn("killed what the crashed worker left running before its slot restarts", "worker", w.Slot,
			"worker_pid", w.PID, "processes", len(left))
	}
	if err != nil {
		log.Error("worker left processes that could not be killed", "worker", w.Slot, "worker_pid", w.PID,
			"error", err)
	}
}

// groupUnit is the worker's unit; for a worker adopted from an agent that
// recorded none, its process group alone (processGroup).
func (w *Worker) groupUnit() *procunit.Unit {
	if w.unit != nil {
		return w.unit
	}
	return processGroup(w.PID, w.startTime)
}

// processGroup is the process group that pid leads as a unit of its own:
// its members count only while pid is still the process that started at
// start (running, or exited and not reaped), and each is signalled through
// a pidfd checked once open, never through the group id.
func processGroup(pid int, start uint64) *procunit.Unit {
	return procunit.Reopen(procunit.Record{PGID: pid, Since: start})
}

// unitRecord describes the worker's unit for the next agent, nil without.
func (w *Worker) unitRecord() *procunit.Record {
	if w.unit == nil {
		return nil
	}
	r := w.unit.Record()
	return &r
}

// A reload returns once every old worker stopped accepting
// (awaitStopAccepting), while the old workers still drain: a process of
// an old worker's unit that left its process group and holds the app's
// listening socket (an escaped daemon) would go on taking connections for
// the old release until the worker exits. It gets the worker's stop
// signal with it (the worker's own signal reaches its process or group
// alone), and one that still holds the socket when the reload is to
// return is killed then. Where the worker exited before, its exit sweep
// kills them, and the reload returns once that sweep ended (endEscaped).

// escapedExitGrace is how long endEscaped waits for an escaped process
// that let go of the sockets to be gone.
const escapedExitGrace = 200 * time.Millisecond

// escapee is such a process, watched through a pidfd.
type escapee struct {
	procunit.Proc
	fd int
}

// stopEscaped sends sig to the processes of the worker's unit outside its
// process group that hold one of its listening sockets, and keeps them in
// w.escaped for endEscaped.
func (w *Worker) stopEscaped(sig syscall.Signal) {
	if w.unit == nil {
		return
	}
	socks := listenerInodes(w.spec)
	if len(socks) == 0 {
		return
	}
	for _, p := range w.unit.Procs() {
		if pg, err := unix.Getpgid(p.PID); err != nil || pg == w.PID {
			continue
		}
		fd, err := unix.PidfdOpen(p.PID, 0)
		if err != nil {
			continue
		}
		// Checked once the pidfd is open: a reused pid (a new worker's,
		// which holds the same sockets) is not in this unit.
		if !w.unit.Has(p.PID) || !holdsOwn(p.PID, socks) {
			unix.Close(fd)
			continue
		}
		_ = unix.PidfdSendSignal(fd, sig, nil, 0)
		// A worker that exits on its signal can be past the start of its
		// exit sweep by now (a sweep of /proc takes a while): the sweep
		// ends the process and endEscaped waits for the sweep, so no one
		// would take the pidfd over.
		w.mu.Lock()
		late := w.swept != nil
		if !late {
			w.escaped = append(w.escaped, escapee{p, fd})
		}
		w.mu.Unlock()
		if late {
			unix.Close(fd)
		}
	}
}

// holdsOwn reports whether process pid itself has one of socks open.
func holdsOwn(pid int, socks map[uint64]bool) bool {
	held, _ := sockdiag.Inodes(pid)
	for ino := range held {
		if socks[ino] {
			return true
		}
	}
	return false
}

// endEscaped waits until each escaped process stopped holding the
// listening sockets or exited, at most until until; it SIGKILLs the ones
// that did not and waits for them (a second at most), naming each in the
// log. Where the worker exited, its exit sweep takes the escaped processes
// over (whichever of the two comes first takes them): then, and whenever
// the sweep began before this returns, it waits until the sweep ended.
// Returning at once there let a reload return while the sweep was still
// killing a daemon that served the old release (issue 40).
func (w *Worker) endEscaped(until time.Time, log hclog.Logger) {
	defer w.awaitSweep(log)
	w.mu.Lock()
	es := w.escaped
	w.escaped = nil
	w.mu.Unlock()
	if len(es) == 0 {
		return
	}
	socks := listenerInodes(w.spec)
	for _, e := range es {
		for !exitedWithin(e.fd, 0) && holdsOwn(e.PID, socks) {
			if time.Now().After(until) {
				_ = unix.PidfdSendSignal(e.fd, unix.SIGKILL, nil, 0)
				exitedWithin(e.fd, time.Second)
				if log != nil {
					log.Warn("a process the worker started outside its process group kept accepting on the app's "+
						"socket after the stop signal; killed it", "worker", w.Slot, "worker_pid", w.PID,
						"pid", e.PID, "command", e.Name)
				}
				break
			}
			exitedWithin(e.fd, stopAcceptingPoll)
		}
		// One that let go of the sockets is most often exiting (its files
		// are closed before it exits): a moment to be gone. One that runs
		// on without them is killed with what else its worker leaves.
		exitedWithin(e.fd, escapedExitGrace)
		unix.Close(e.fd)
	}
}

// beginSweep marks the start of the worker's exit sweep: it takes over the
// escaped processes endEscaped has not taken, and returns them with
// w.swept, which the sweep closes once it ended (awaitSweep).
func (w *Worker) beginSweep() ([]escapee, chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	es := w.escaped
	w.escaped = nil
	w.swept = make(chan struct{})
	return es, w.swept
}

// awaitSweep waits, once the worker's exit sweep began, until it ended
// (it is bounded by sweepTimeout), so that nothing of the worker's unit is
// left holding the app's sockets; at once if it has not begun.
func (w *Worker) awaitSweep(log hclog.Logger) {
	w.mu.Lock()
	swept := w.swept
	w.mu.Unlock()
	if swept == nil {
		return
	}
	t := time.NewTimer(sweepTimeout + time.Second)
	defer t.Stop()
	select {
	case <-swept:
	case <-t.C:
		if log != nil {
			log.Error("the sweep of what an old worker left running did not end in time; the operation returns "+
				"without it", "worker", w.Slot, "worker_pid", w.PID, "waited", sweepTimeout+time.Second)
		}
	}
}

// killEscaped SIGKILLs, once the worker exited, the escaped processes es
// that endEscaped did not end (those that got its stop signal), through
// their pidfds, and waits until they are gone (at most until ctx ends).
// One that is exiting from the stop signal is past the unit's sweep (its
// environment is gone) but not gone yet. It returns those it killed.
func killEscaped(ctx context.Context, es []escapee) []procunit.Proc {
	if len(es) > 0 {
		failpoint.HoldSweep() // a stress test's slow sweep; nothing otherwise
	}
	var killed []procunit.Proc
	for _, e := range es {
		if !exitedWithin(e.fd, 0) {
			_ = unix.PidfdSendSignal(e.fd, unix.SIGKILL, nil, 0)
			killed = append(killed, e.Proc)
		}
	}
	deadline, _ := ctx.Deadline()
	for _, e := range es {
		exitedWithin(e.fd, time.Until(deadline))
		unix.Close(e.fd)
	}
	return killed
}

// exitedWithin reports whether the process of pidfd fd exits within d.
func exitedWithin(fd int, d time.Duration) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		n, err := unix.Poll(pfd, int(max(time.Until(deadline).Milliseconds(), 0))) // -1 would wait for ever
		if err == nil || !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			return n > 0
		}
	}
}
