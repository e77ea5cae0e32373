package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// statusEvery is how often the agent refreshes its STATUS= line for systemd.
const statusEvery = 5 * time.Second

// activation takes the sockets systemd passed to the agent (LISTEN_FDS
// for this pid) for the listener registry, and clears LISTEN_* from its
// environment, so that neither its workers nor a new agent after a handoff
// see them. A new agent started by a handoff gets its sockets from the
// previous agent instead.
func activation(log hclog.Logger, hasParent bool) []*handoff.Activated {
	socks, skipped, err := handoff.ActivationFromEnv()
	if err != nil {
		log.Warn("socket activation: ignoring the sockets systemd passed", "error", err)
	}
	for _, s := range skipped {
		log.Warn("socket activation: descriptor ignored", "socket", s)
	}
	if hasParent {
		for _, s := range socks { // not possible: the previous agent cleared LISTEN_*
			s.Close()
		}
		return nil
	}
	for _, s := range socks {
		log.Info("socket activation: received socket", "socket", s.String())
	}
	return socks
}

// afterSetup runs once every app's listeners are acquired: it reports
// sockets from systemd no listen URL took and opens the metrics listener.
func (a *Agent) afterSetup() error {
	for _, s := range a.reg.Unclaimed() {
		a.log.Warn("socket activation: no listen URL matches this socket; it stays unused "+
			"(a reload that adds a matching listen URL takes it, an agent handoff drops it)", "socket", s)
	}
	var err error
	a.metrics, err = listenMetrics(a.upg.Fds(), a.settings.Metrics)
	return err
}

// listenMetrics opens (or inherits) the listener of the metrics endpoint
// on addr; "" leaves metrics off. A busy address is an error (the agent
// does not start). The listener crosses an agent handoff (tableflip), so
// the new agent serves the same port without a gap.
func listenMetrics(fds fdStore, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := fds.Listener("tcp", addr) // from the previous agent
	if err == nil && ln == nil {
		ln, err = net.Listen("tcp", addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, &handoff.AddrInUseError{URL: "[agent] metrics " + addr, Holder: handoff.Holder("tcp", addr), Err: err}
		}
		if err == nil {
			if err = fds.AddListener("tcp", addr, ln.(*net.TCPListener)); err != nil {
				ln.Close()
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", addr, err)
	}
	return ln, nil
}

// statusUpdates sends systemd a STATUS= line once the agent is ready and
// whenever it changes (checked every statusEvery), until stop is closed;
// when systemd gave us no NOTIFY_SOCKET it only waits for stop.
func (a *Agent) statusUpdates(stop <-chan struct{}) {
	if os.Getenv(handoff.EnvNotifySocket) == "" {
		<-stop
		return
	}
	select {
	case <-a.ready:
	case <-stop:
		return
	}
	t := time.NewTicker(statusEvery)
	defer t.Stop()
	last := ""
	for {
		if line := statusLine(a.apps.list()); line != last {
			notify("STATUS=" + line)
			last = line
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// statusLine is the agent's one-line state for `systemctl status`, e.g.
// "serving 4 ready workers of 2 apps; api: reloading".
func statusLine(rts []*appRT) string {
	ready, others := 0, 0
	var notes []string
	for _, rt := range rts {
		st := appStatus(rt)
		for _, w := range st.Workers {
			if w.State == string(workers.Ready) {
				ready++
			} else {
				others++
			}
		}
		if st.State != string(workers.AppRunning) {
			notes = append(notes, rt.name+": "+st.State)
		}
	}
	line := fmt.Sprintf("serving %s of %s", plural(ready, "ready worker"), plural(len(rts), "app"))
	if others > 0 {
		line += fmt.Sprintf(" (+%d starting, draining or stopping)", others)
	}
	if len(notes) > 0 {
		line += "; " + strings.Join(notes, ", ")
	}
	return line
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// notify sends state to systemd when it gave us NOTIFY_SOCKET.
func notify(state string) { _, _ = daemon.SdNotify(false, state) }
