package workers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/failpoint"
)

// A worker's pid is its own only until it is reaped: after that the kernel
// may give it to any new process, and a process group of that id may be
// anyone's (a root shell's job). So no signal goes to a pid or a group id
// after the reap: the main process is signalled through a pidfd (opened
// while it was known to be the worker), its group only while it is our
// unreaped child (reapMu), and whatever else of its unit through the
// unit (cgroup.kill, or each process through a pidfd checked once open).
// The reap itself waits until that is done: the worker's exit is awaited
// without reaping, what it left running is killed, and only then is it
// reaped (wait).

// killGroup SIGKILLs the worker: its whole process group while the group
// id is still its own (signalGroup), else its main process through its
// pidfd (nothing once it was reaped) and, for an adopted worker, each
// process of its group through a checked pidfd (processGroup); what is left
// of its unit is killed when its main process has exited (sweep). Never a pid or a group
// id that may have been reused. Safe to call at any time, and concurrently.
func (w *Worker) killGroup() {
	if w.signalGroup(syscall.SIGKILL) {
		return
	}
	w.signalMain(syscall.SIGKILL)
	if w.pidfd != nil { // adopted: its group, each process checked
		g := processGroup(w.PID, w.startTime)
		ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
		_ = g.Kill(ctx)
		cancel()
		g.Close()
	}
}

// signalGroup sends sig to the worker's process group and reports whether
// it could: only for our own child, and only until it is reaped (reapMu),
// while its pid, the group's id, cannot name another process's group. An
// adopted worker is reaped by its parent, out of our sight: never.
func (w *Worker) signalGroup(sig syscall.Signal) bool {
	if w.proc == nil {
		return false
	}
	w.reapMu.Lock()
	defer w.reapMu.Unlock()
	if w.reaped {
		return false
	}
	_ = syscall.Kill(-w.PID, sig)
	return true
}

// signalMain sends sig to the worker's main process through its pidfd:
// os.Process holds one for our child (and refuses once it was reaped),
// w.pidfd for an adopted one.
func (w *Worker) signalMain(sig syscall.Signal) {
	if w.pidfd != nil {
		_ = w.pidfd.Signal(sig)
		return
	}
	_ = w.proc.Signal(sig)
}

// signal sends sig to the worker: its main process, or for a node app
// started through npm its process group (ours until reaped), or every
// process of its unit (an adopted one; each through a checked pidfd).
func (w *Worker) signal(sig syscall.Signal) {
	failpoint.DelaySignal() // a stress run's late signal; nothing otherwise
	if s, ok := sourceOf(w.spec).(sourceStopper); ok && s.stopsGroup(w) {
		if w.signalGroup(sig) {
			return
		}
		if w.pidfd != nil && w.unit != nil {
			w.unit.Signal(sig)
			return
		}
		if w.pidfd != nil {
			g := processGroup(w.PID, w.startTime)
			g.Signal(sig)
			g.Close()
			return
		}
	}
	w.signalMain(sig)
}

// errAdoptedExit is the exit of an adopted worker: only its parent (the
// previous agent, or init after it) can read its status.
var errAdoptedExit = errors.New("exited; status unknown: started by the previous agent")

// awaitExit waits until the worker's main process has exited: for our
// child without reaping it (a pidfd poll, handoff.AwaitExit), so that its
// group id stays its own until reap; for an adopted one its pidfd polls
// readable. Neither holds an OS thread while the worker runs.
func (w *Worker) awaitExit() error {
	if w.pidfd == nil {
		return handoff.AwaitExit(w.proc)
	}
	err := w.pidfd.Wait()
	w.pidfd.Close()
	if err != nil {
		return fmt.Errorf("watch adopted worker: %w", err)
	}
	return nil
}

// reap reaps our child after awaitExit (its exit status), and from then
// on no signal goes to its process group. An adopted worker's status is
// its parent's to read.
func (w *Worker) reap(exitErr error) (*os.ProcessState, error) {
	if w.pidfd != nil {
		if exitErr != nil {
			return nil, exitErr
		}
		return nil, errAdoptedExit
	}
	w.reapMu.Lock()
	w.reaped = true
	w.reapMu.Unlock()
	return w.proc.Wait()
}

// wait waits for the worker to exit, kills what it left running (while
// its pid is still its own), reaps it and drains its output.
func (w *Worker) wait(log hclog.Logger, readers *sync.WaitGroup, chans, ends []*os.File) {
	exitErr := w.awaitExit()
	exitedAt := time.Now()
	if s, ok := sourceOf(w.spec).(sourceStopper); ok {
		s.awaitGone(w) // npm start: the app's node may outlive npm
	}
	// What it left running (which may hold its output pipes) dies with
	// its unit, before the reap: its group id is still its own.
	w.sweep(log, exitedAt)
	st, err := w.reap(exitErr)
	w.drainOutput(readers, chans, ends)
	w.mu.Lock()
	w.exitState, w.exitErr, w.exitedAt = st, err, exitedAt
	w.mu.Unlock()
}
