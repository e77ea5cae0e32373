package workers

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNoListen is what Discover returns for an app whose process never
// listened (or exited without doing so) before ready_timeout.
var ErrNoListen = errors.New("the app did not listen")

// Discover learns where the Node.js app of spec listens when its config
// has no listen list: it runs one worker of spec without listeners, with
// the preload in discovery mode, which reports the app's first
// listen(port) or listen(path) and exits before the app serves anything.
// It returns that address (tcp://HOST:PORT or unix:///PATH), as the app's
// code asked for it and read from the preload's own channel only: input
// the agent puts to its address policy before it binds anything. The run
// is bounded by spec.ReadyTimeout; its output goes to the app's logs. It
// changes nothing the supervisor keeps, and may run beside an operation.
func (s *Supervisor) Discover(spec *Spec) (string, error) {
	if spec.Node == nil || len(spec.Listeners) > 0 {
		return "", errors.New("workers: Discover needs a node app without listeners")
	}
	probe := *spec
	node := *spec.Node
	node.Discover, node.ReportReady, node.Health = true, false, false
	probe.Node, probe.Health = &node, nil
	a := s.args()
	a.beforeStart, a.onReady = nil, nil // not a worker of the pool: no record, no ready
	w, err := spawn(a, &probe, 0)
	if err != nil {
		return "", fmt.Errorf("workers: discovering where app %s listens: %w", s.opts.App, err)
	}
	t := time.NewTimer(max(spec.ReadyTimeout, time.Second))
	defer t.Stop()
	timedOut := false
	select {
	case <-w.exited:
	case <-t.C:
		timedOut = true
	case <-s.cancel:
		timedOut = true
	}
	w.killGroup()
	<-w.exited
	w.mu.Lock()
	asked := w.asked
	w.mu.Unlock()
	if asked != nil {
		return *asked, nil
	}
	why := "exited (" + w.ExitDescription() + ")"
	if timedOut {
		why = "did not call listen within ready_timeout " + spec.ReadyTimeout.String() +
			" (an app that starts slowly, such as one ts-node type-checks first, needs a longer ready_timeout)"
	}
	msg := fmt.Sprintf(": app %s has no listen list, and its node process %s", s.opts.App, why)
	w.mu.Lock()
	status := w.status
	w.mu.Unlock()
	if strings.HasPrefix(status, "left listen(") {
		// Its only listen was on a unix socket: the app's own (root serves a
		// unix path only when the config names it; see internal/addrpolicy).
		msg += "; deployd " + status + "; to serve that socket, root adds listen = [\"unix://PATH\"] (in a folder the app's user cannot write)"
	}
	if lines := w.LastLines(); len(lines) > 0 {
		msg += "; its last output: " + strings.Join(lines[max(0, len(lines)-5):], " | ")
	}
	return "", fmt.Errorf("%w%s; add listen = [\"tcp://0.0.0.0:PORT\"] to [apps.%s] in deployd.toml", ErrNoListen, msg, s.opts.App)
}
