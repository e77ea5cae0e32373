package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killScenario names the manager-SIGKILL rows of the results.
const killScenario = "manager SIGKILL"

// deploydKiller SIGKILLs the agent and starts the next one on the same
// config at once (systemd's Restart= without RestartSec): it adopts the
// workers, which served all along.
type deploydKiller struct {
	*deploydSystem
	rep int
}

func (s deploydKiller) reload(ctx context.Context, _ string) error {
	before := s.workerPIDs()
	t0 := time.Now()
	if err := syscall.Kill(s.agent.pid(), syscall.SIGKILL); err != nil {
		return err
	}
	<-s.agent.done
	if err := s.startAgent(ctx); err != nil {
		return err
	}
	s.b.recordKill(s.name(), s.rep, t0, before, s.workerPIDs())
	return nil
}

// pm2Killer SIGKILLs PM2's daemon ("God") and runs `pm2 resurrect`, what
// the systemd unit of `pm2 startup` runs when systemd restarts it, on the
// list `pm2 save` wrote before the kill; then waits until every worker is
// online (pm2's API, polled every 5 ms).
type pm2Killer struct {
	*pm2System
	rep int
}

func (s pm2Killer) reload(ctx context.Context, _ string) error {
	if s.poller != nil { // its connection goes with the daemon
		s.poller.close()
		s.poller = nil
	}
	if out, err := s.pm2(ctx, time.Minute, "save"); err != nil {
		return fmt.Errorf("pm2 save: %w\n%s", err, out)
	}
	before := s.workerPIDs()
	t0 := time.Now()
	if err := syscall.Kill(s.god, syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); alive(s.god); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pm2 daemon %d alive 10s after SIGKILL", s.god)
		}
	}
	if out, err := s.pm2(ctx, 2*time.Minute, "resurrect"); err != nil {
		return fmt.Errorf("pm2 resurrect: %w\n%s", err, out)
	}
	s.b.logf("    pm2: pm2 resurrect returned %v after the kill", time.Since(t0).Round(time.Millisecond))
	b, err := os.ReadFile(filepath.Join(s.home, "pm2.pid"))
	if err != nil {
		return fmt.Errorf("pm2 daemon pid: %w", err)
	}
	if s.god, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return fmt.Errorf("pm2.pid: %w", err)
	}
	trackPID(s.god, "pm2 daemon")
	// pm2's API polled every 5 ms (as in the crash runs), not `pm2 jlist`,
	// whose own start takes about a second.
	if err := s.ensurePoller(); err != nil {
		return err
	}
	n := s.app.instances
	if _, err := s.poller.wait(ctx, time.Minute, func(ps []pm2Proc) bool { return len(ps) == n && allOnline(ps) }); err != nil {
		return fmt.Errorf("pm2 resurrect: %w", err)
	}
	for _, pid := range before {
		if alive(pid) { // left by the dead daemon, if any: not PM2's any more
			trackPID(pid, "pm2 worker left by a killed daemon")
		}
	}
	s.b.recordKill(s.name(), s.rep, t0, before, s.workerPIDs())
	return nil
}

// recordKill records a manager SIGKILL at t0: the time until the manager
// serves again (every worker ready or online) and whether the workers kept
// their pids.
func (b *bench) recordKill(sys string, rep int, t0 time.Time, before, after []int) {
	d := time.Since(t0)
	slices.Sort(before)
	slices.Sort(after)
	kept := 0.0
	if slices.Equal(before, after) {
		kept = 1
	}
	b.res.add(killScenario, sys, "back_ms", rep, ms(d))
	b.res.add(killScenario, sys, "pids_kept", rep, kept)
	b.logf("    %s: manager SIGKILLed, serving again (all workers ready) %v later; workers %v, before %v",
		sys, d.Round(time.Millisecond), after, before)
}

// managerKillsUnderLoad SIGKILLs the manager b.reloads times under load
// and brings the next one: deployd's next agent adopts the workers; PM2's
// resurrected daemon starts them again.
func (b *bench) managerKillsUnderLoad(ctx context.Context) error {
	for rep := range b.repeats {
		b.logf("manager SIGKILLs under load, repeat %d/%d", rep+1, b.repeats)
		app := appSpec{kind: "node", instances: b.instances}
		ss := []reloader{deploydKiller{&deploydSystem{b: b, label: sysDeployd, app: app}, rep}}
		if b.pm2 != "" {
			ss = append(ss, pm2Killer{&pm2System{b: b, app: app}, rep})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error { return b.loadedRun(ctx, sys, rep, killScenario, false) })
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) reportKills(w io.Writer) {
	r := &b.res
	if len(r.vals(killScenario, sysDeployd, "failed")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Manager SIGKILL under load (%d kills per run)\n\n", b.reloads)
	fmt.Fprintf(w, "`kill -9` of the deployd agent, then the next agent started at once on the same config "+
		"(it adopts the workers), against `kill -9` of PM2's daemon, then `pm2 resurrect` (what the unit of "+
		"`pm2 startup` runs) on the list `pm2 save` wrote just before. Back = from the kill until every "+
		"worker is ready (deployd status, polled back to back) or online (pm2's API, polled every 5 ms) "+
		"under the next manager.\n\n")
	t := &table{head: []string{"system", "failed requests, total (per run)", "of which connect errors", "requests",
		"back, ms", "kills keeping every worker pid", "max ms"}}
	for _, sys := range []string{sysPM2, sysDeployd} {
		if len(r.vals(killScenario, sys, "failed")) == 0 {
			continue
		}
		kept := r.vals(killScenario, sys, "pids_kept")
		t.row(sys, fmt.Sprintf("**%.0f** (%s)", sum(r.vals(killScenario, sys, "failed")), mmm(r.vals(killScenario, sys, "failed"), "%.0f")),
			fmt.Sprintf("%.0f", sum(r.vals(killScenario, sys, "connect_errors"))),
			fmt.Sprintf("%.0f", sum(r.vals(killScenario, sys, "requests"))),
			mmm(r.vals(killScenario, sys, "back_ms"), "%.0f"),
			fmt.Sprintf("%.0f of %d", sum(kept), len(kept)),
			mmm(r.vals(killScenario, sys, "max"), "%.0f"))
	}
	fmt.Fprintln(w, t)
}

// startAgent starts `deployd agent` on the system's config and waits
// until every worker is ready.
func (s *deploydSystem) startAgent(ctx context.Context) error {
	level := []string{"--log-level", "info"}
	if s.steps {
		level = []string{"--log-level", "debug", "--log-format", "json"}
	}
	cmd := exec.Command(s.b.deployd, append([]string{"agent", "-c", s.config}, level...)...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "DEPLOYD_SOCKET=")
	var err error
	if s.agent, err = startProc(s.label+"-agent", cmd, filepath.Join(s.dir, "agent.log"), false); err != nil {
		return err
	}
	return s.waitReady(ctx, 60*time.Second+s.app.startupDelay*2)
}
