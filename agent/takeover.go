package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/failpoint"
	"github.com/deployd/deployd/workers"
)

// takeover is a new agent's side of an upgrade: it reads the previous
// agent's handover, decides what to do when the previous agent does not
// take the handoff, and retires the handed-over workers of apps this agent
// does not run. parent and orphaned are set once (Run, lost) before
// teardown reads them; orphans by the start, read once this agent serves.
type takeover struct {
	log     hclog.Logger
	upg     upgrader
	shim    string
	timeout time.Duration // [agent] upgrade_timeout
	// parent is the previous agent's pid (0: this agent was not started
	// by one).
	parent int
	// orphaned: the previous agent died during the handoff and this one
	// exits for systemd's next agent, which adopts the workers from this
	// one's record: teardown keeps it (lost).
	orphaned bool
	// orphans were handed over for apps this agent does not run.
	orphans map[string][]*workers.Handover
}

// receive reads the previous agent's handover, if it sent one.
// Only a parcel stream from our own parent counts.
func (t *takeover) receive() (*received, error) {
	if !t.upg.HasParent() {
		return nil, nil
	}
	f, err := t.upg.Fds().File(handoverName)
	if err != nil || f == nil {
		return nil, err
	}
	defer f.Close()
	ps, err := handoff.ReceiveParcels(f, time.Now().Add(t.timeout))
	if err != nil {
		return nil, err
	}
	r := &received{byApp: map[string][]*workers.Handover{}, pools: map[string]*workers.PoolHandover{},
		unhealthy: map[string]bool{}}
	var hdr handoverHeader
	if len(ps) == 0 || json.Unmarshal(ps[0].Header, &hdr) != nil || hdr.AgentPID != os.Getppid() {
		for _, p := range ps {
			closeAll(p.Files)
		}
		return nil, fmt.Errorf("handover channel: no header from the parent agent %d", os.Getppid())
	}
	if hdr.Version >= 2 && len(ps)-1 != hdr.Workers {
		for _, p := range ps {
			closeAll(p.Files)
		}
		return nil, fmt.Errorf("handover channel: %d of the %d workers the parent agent %d handed over arrived",
			len(ps)-1, hdr.Workers, os.Getppid())
	}
	r.restart = hdr.RestartWorkers
	for _, app := range hdr.Unhealthy {
		r.unhealthy[app] = true
	}
	for _, p := range ps[1:] {
		var wp workerParcel
		if err := json.Unmarshal(p.Header, &wp); err != nil || wp.Worker == nil {
			closeAll(p.Files)
			if err == nil && wp.Pool != nil {
				r.pools[wp.App] = wp.Pool
			}
			continue
		}
		wp.Worker.SetFiles(p.Files)
		r.byApp[wp.App] = append(r.byApp[wp.App], wp.Worker)
	}
	return r, nil
}

// lost decides what a new agent does when it could not tell the
// previous agent it is ready (err). nil: it serves on. An error: it
// exits, leaving every worker running (quiet), for the agent that is
// to serve them:
//   - the previous agent still runs (it gave up the upgrade): that one;
//   - it died (SIGKILL mid-handoff) and systemd supervises the agent: the
//     next one systemd starts (Restart=), which adopts the workers from the
//     record loop wrote once ready. systemd may have seen the previous agent die
//     before it read this one's MAINPID, and then it restarts the service
//     whatever this agent does; an agent serving on would hold the control
//     socket, and each restart would fail until systemd gave up, leaving
//     an agent it does not know (seen in a CI run). Exiting non-zero
//     restarts the service in the other case too;
//   - it died, and nothing would start another: this one.
func (t *takeover) lost(err error) error {
	switch {
	case os.Getppid() == t.parent:
		t.log.Error("the previous agent did not take the handoff; giving up so that it keeps serving", "error", err)
		return fmt.Errorf("upgrade abandoned: %w", err)
	case os.Getenv(handoff.EnvNotifySocket) != "":
		t.log.Error("the previous agent died during the handoff; exiting, the workers left running, "+
			"so that systemd starts the next agent, which adopts them", "error", err)
		notify("STATUS=the previous agent died during the handoff; exiting for systemd to start the next agent")
		t.orphaned = true
		return fmt.Errorf("upgrade interrupted: the previous agent died during the handoff: %w", err)
	default:
		t.log.Warn("the previous agent died during the handoff; this agent serves on", "error", err)
		return nil
	}
}

// envHandoffHold is failpoint.EnvHandoffHold.
const envHandoffHold = failpoint.EnvHandoffHold

// handoffHold reads envHandoffHold: how long to hold, and whether before
// telling systemd.
func handoffHold() (d time.Duration, beforeSystemd bool) {
	v, beforeSystemd := strings.CutPrefix(os.Getenv(envHandoffHold), "before:")
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false
	}
	return min(d, 30*time.Second), beforeSystemd
}

// hold holds a new agent for envHandoffHold at the point it names:
// before telling systemd its pid (beforeSystemd), or after, before telling
// the previous agent.
func (t *takeover) hold(beforeSystemd bool) {
	d, before := handoffHold()
	if d <= 0 || !t.upg.HasParent() || before != beforeSystemd {
		return
	}
	what := map[bool]string{true: "systemd", false: "the previous agent"}[before]
	t.log.Warn("holding the handoff before telling "+what+" (a test's failpoint)", "env", envHandoffHold, "for", d)
	time.Sleep(d)
}

// retireOrphans stops the handed-over workers (orphans) of apps this agent does not
// run (removed from the config, or stopped): a supervisor with no slots
// adopts nothing and retires every one.
func (t *takeover) retireOrphans() {
	byApp := t.orphans
	t.orphans = nil
	for app, hs := range byApp {
		sup := workers.New(workers.Options{App: app, Shim: t.shim, Logger: t.log.Named("workers")},
			&workers.Spec{Release: "retired"})
		if err := sup.Adopt(hs); err != nil {
			t.log.Warn("retire workers of the previous agent", "app", app, "error", err)
		}
		sup.Stop()
	}
}
