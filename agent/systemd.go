package agent

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// statusEvery is how often the agent refreshes its STATUS= line for systemd.
const statusEvery = 5 * time.Second

// sysState is the agent's systemd and metrics plumbing. activated is guarded
// by Agent.mu; the rest is owned by Run.
type sysState struct {
	// activated are the sockets from socket activation no app has taken yet.
	activated []*handoff.Activated
	metrics   *metricsServer
	// statusStop is closed to stop the STATUS= updates; statusDone is closed
	// when they stopped.
	statusStop, statusDone chan struct{}
}

// loadActivation takes the sockets systemd passed to the agent (LISTEN_FDS
// for this pid) and clears LISTEN_* from its environment, so that neither its
// workers nor a new agent after a handoff see them. A new agent started by a
// handoff gets its sockets from the previous agent instead.
func (a *Agent) loadActivation() {
	socks, skipped, err := handoff.ActivationFromEnv()
	if err != nil {
		a.log.Warn("socket activation: ignoring the sockets systemd passed", "error", err)
	}
	for _, s := range skipped {
		a.log.Warn("socket activation: descriptor ignored", "socket", s)
	}
	if a.upg.HasParent() {
		for _, s := range socks { // not possible: the previous agent cleared LISTEN_*
			s.Close()
		}
		return
	}
	for _, s := range socks {
		a.log.Info("socket activation: received socket", "socket", s.String())
	}
	a.sys.activated = socks
}

// adoptActivated returns the socket systemd passed for listen URL l of app,
// matched by bound address or else by FileDescriptorName (the URL's #name,
// by default the app name), and keeps it in a.listeners; nil when none
// matches. Called with a.mu held or before the agent serves.
func (a *Agent) adoptActivated(app *config.App, l config.Listen) (*handoff.Listener, error) {
	if len(a.sys.activated) == 0 {
		return nil, nil
	}
	idx, by := -1, "address"
	for i, s := range a.sys.activated {
		if s.Matches(l.Network, l.Address) {
			idx = i
			break
		}
	}
	if idx < 0 {
		by = "name"
		var named []string
		for i, s := range a.sys.activated {
			if s.Name == l.Name && s.FamilyFits(l.Network) {
				idx = i
				named = append(named, s.Addr)
			}
		}
		if len(named) > 1 {
			return nil, fmt.Errorf("systemd passed %d sockets named %q (%s) and none is bound to %s; "+
				"give each socket unit its own FileDescriptorName= or make a ListenStream= match the address",
				len(named), l.Name, strings.Join(named, ", "), l.Address)
		}
	}
	if idx < 0 {
		return nil, nil
	}
	s := a.sys.activated[idx]
	hl, err := handoff.AdoptActivated(a.upg.Fds, s, l.Network, l.Address, l.Name)
	if err != nil {
		return nil, err
	}
	a.sys.activated = append(a.sys.activated[:idx], a.sys.activated[idx+1:]...)
	a.listeners[hl.Key()] = hl
	a.log.Info("adopted socket from systemd socket activation", "app", app.Name, "listen", l.URL,
		"socket", s.Addr, "fd_name", s.Name, "matched_by", by)
	if by == "name" {
		a.log.Warn("the socket from systemd is bound to another address than the listen URL; serving on systemd's",
			"app", app.Name, "listen", l.URL, "socket", s.Addr)
	}
	// The workers get the socket as systemd made it (NonBlocking= of the service).
	if nb, err := hl.Nonblocking(); err == nil && nb != app.Nonblocking {
		a.log.Warn("the socket from systemd has another O_NONBLOCK mode than the app's nonblocking setting; "+
			"workers get systemd's (set NonBlocking= in the service to match)",
			"app", app.Name, "listen", l.URL, "nonblocking", nb, "app_nonblocking", app.Nonblocking)
	}
	return hl, nil
}

// afterSetup runs once every app's listeners are acquired: it reports
// sockets from systemd no listen URL took and starts the metrics server.
func (a *Agent) afterSetup(cfg *config.Config) error {
	a.mu.Lock()
	for _, s := range a.sys.activated {
		a.log.Warn("socket activation: no listen URL matches this socket; it stays unused "+
			"(a reload that adds a matching listen URL takes it, an agent handoff drops it)", "socket", s.String())
	}
	a.mu.Unlock()
	return a.startMetrics(cfg.Agent.Metrics)
}

// stopSys stops the metrics server and the STATUS= updates and closes the
// unused sockets from systemd. Safe to call twice.
func (a *Agent) stopSys() {
	a.stopStatusUpdates()
	a.sys.metrics.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.sys.activated {
		s.Close()
	}
	a.sys.activated = nil
}

// startStatusUpdates sends systemd a STATUS= line now and whenever it
// changes (checked every statusEvery), when systemd gave us NOTIFY_SOCKET.
func (a *Agent) startStatusUpdates() {
	if os.Getenv(handoff.EnvNotifySocket) == "" || a.sys.statusStop != nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	a.sys.statusStop, a.sys.statusDone = stop, done
	go func() {
		defer close(done)
		t := time.NewTicker(statusEvery)
		defer t.Stop()
		last := ""
		for {
			if line := a.statusLine(); line != last {
				sdNotify("STATUS=" + line)
				last = line
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
}

// stopStatusUpdates stops the STATUS= updates and waits until they stopped.
// Safe to call twice, and when they never started.
func (a *Agent) stopStatusUpdates() {
	if a.sys.statusStop == nil {
		return
	}
	select {
	case <-a.sys.statusStop:
	default:
		close(a.sys.statusStop)
	}
	<-a.sys.statusDone
}

// statusLine is the agent's one-line state for `systemctl status`, e.g.
// "serving 4 ready workers of 2 apps; api: reloading".
func (a *Agent) statusLine() string {
	a.mu.Lock()
	rts := make([]*appRT, 0, len(a.apps))
	for _, n := range sortedKeys(a.apps) {
		rts = append(rts, a.apps[n])
	}
	a.mu.Unlock()
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
