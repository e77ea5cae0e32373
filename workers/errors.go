package workers

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/deployd/deployd/handoff"
)

// ErrBusy matches (errors.Is) every *BusyError.
var ErrBusy = errors.New("workers: another operation of this app is running")

// ErrCanceled is returned when an operation was stopped by a shutdown.
var ErrCanceled = errors.New("workers: canceled by shutdown")

// BusyError refuses an operation while another runs; it names that one.
type BusyError struct {
	App string
	// Op is what runs, e.g. "reload to release v2" or "memory-limit
	// replacement of worker 1".
	Op    string
	Since time.Time
	// By is who started it when the supervisor knows ("the max_memory
	// monitor"); empty for operations its caller started.
	By string
}

func (e *BusyError) Error() string {
	msg := fmt.Sprintf("workers: %s is busy: %s running since %s", e.App, e.Op, e.Since.Format(time.TimeOnly))
	if e.By != "" {
		msg += " (started by " + e.By + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrBusy) true.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// SlotRelease is the release one slot runs.
type SlotRelease struct {
	Slot    int
	Release string
}

// AbandonedError is returned by Reload when a new worker did not get ready:
// new workers were stopped and the slots already swapped were rolled back.
type AbandonedError struct {
	Reason     error
	ExitStatus string   // of the new worker, when it exited
	LastLines  []string // of the new worker's output
	// RolledBack is true when every slot runs the previous version again;
	// false when a rollback step failed and some slot kept the new one.
	RolledBack bool
	// Slots says which release each slot runs after the rollback.
	Slots []SlotRelease
	// First is true when no worker served before the operation (an app's
	// first deploy): none serves after it either.
	First bool
}

func (e *AbandonedError) Error() string {
	return fmt.Sprintf("reload abandoned, %s: %v", e.Serving(), e.Reason)
}

// Serving says what serves after the abandon: "previous version still
// serving" only when the rollback restored every slot, and "nothing
// serves" when there was no previous version.
func (e *AbandonedError) Serving() string {
	if e.First {
		return "no previous version: nothing served before and nothing serves now"
	}
	if e.RolledBack {
		return "previous version still serving"
	}
	parts := make([]string, 0, len(e.Slots))
	for _, s := range e.Slots {
		parts = append(parts, fmt.Sprintf("worker %d runs %s", s.Slot, s.Release))
	}
	return "rollback incomplete: " + strings.Join(parts, ", ")
}

func (e *AbandonedError) Unwrap() error { return e.Reason }

// NotReadyError tells why a worker never got ready.
type NotReadyError struct {
	Worker  *Worker
	Exited  bool
	Timeout time.Duration
	// AfterReady is set when the worker exited after it was ready but
	// before its operation ended (or within min_ready).
	AfterReady bool
}

func (e *NotReadyError) Error() string {
	msg := e.reason()
	w := e.Worker
	if why := w.refusal(); why != "" {
		// The agent refused its bind: nothing was bound for it, and the
		// workers it was to replace serve on.
		return msg + "; its bind was refused, nothing was changed: " + why
	}
	w.mu.Lock()
	status := w.status
	w.mu.Unlock()
	if w.spec != nil && w.spec.Node != nil && w.spec.Node.Learn && strings.HasPrefix(status, "left listen(") {
		// Its only listen was on a unix socket: the app's own, which root
		// serves only where the config names it (internal/addrpolicy).
		return msg + "; deployd " + status + "; nothing was changed"
	}
	return msg
}

func (e *NotReadyError) reason() string {
	w := e.Worker
	if e.AfterReady {
		return fmt.Sprintf("worker %d (pid %d) exited %s after it was ready, before the operation ended: %s",
			w.Slot, w.PID, w.upAfterReady().Round(time.Millisecond), w.ExitDescription())
	}
	if e.Exited {
		return fmt.Sprintf("worker %d (pid %d) exited before it was ready: %s", w.Slot, w.PID, w.ExitDescription())
	}
	hint := readyHint(w.spec)
	if last := w.healthError(); last != "" && w.spec != nil && w.spec.Ready.Mode == ReadyHTTP {
		hint = "; last health check: " + last + hint
	}
	return fmt.Sprintf("worker %d (pid %d) was not ready within ready_timeout %s%s", w.Slot, w.PID, e.Timeout, hint)
}

// readyHint says what the app must do for its readiness mode.
func readyHint(spec *Spec) string {
	if spec == nil {
		return ""
	}
	switch spec.Ready.Mode {
	case ReadyNodeIPC:
		return `; with ready = "node-ipc" the app must call process.send('ready') once it listens: check that it does, and that node runs the app itself (not through npm or a shell)`
	case ReadyNotify:
		if spec.Node != nil {
			return nodeReadyHint(spec)
		}
		return `; with ready = "notify" the app must send READY=1 to $NOTIFY_SOCKET (sd_notify) once it listens`
	case ReadyBind:
		return `; with ready = "bind" (the default where the agent answers the app's binds) the app must bind the port of every TCP listen ` +
			`(its own bind, e.g. ListenAndServe(":PORT"), or PORT from its env) or send READY=1 to $NOTIFY_SOCKET; ` +
			`an app that binds another port gets no answer: check PORT and listen`
	case ReadyLog:
		return fmt.Sprintf(`; with ready = "log:..." a line of its output must match %s`, spec.Ready.Regex)
	case ReadyHTTP:
		return fmt.Sprintf(`; with ready = "http:%s" the app must answer GET %s with 2xx on the listener named %q `+
			`in LISTEN_FDNAMES (the last inherited fd): serve every inherited socket, not only fd 3`,
			spec.Ready.Path, spec.Ready.Path, handoff.HealthFDName)
	}
	return ""
}

// nodeReadyHint is readyHint for a Node.js app: its preload reports it
// ready once the app's own listen() serves every configured listener, so
// the app never listened on one of them.
func nodeReadyHint(spec *Spec) string {
	addrs := make([]string, 0, len(spec.Listeners))
	for _, l := range spec.Listeners {
		addrs = append(addrs, l.Key())
	}
	if len(addrs) == 0 && spec.Node.Learn {
		return "; the Node.js app has no listen list and never listened on a TCP port (deployd learns its address from its own bind): " +
			"a server must listen (server.listen(PORT)), or root sets listen = [\"tcp://0.0.0.0:PORT\"] in its table"
	}
	if len(addrs) == 0 {
		return "; the Node.js app never called listen(): a server must listen (server.listen(PORT)) for deployd to know it is ready"
	}
	return "; the Node.js app did not call listen() on " + strings.Join(addrs, ", ") +
		" (deployd's preload reports it ready once its own listen serves each of them): check the port it listens on, or its start-up output below"
}
