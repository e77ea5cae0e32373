package main

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"time"
)

// upgradeScenario names the agent-upgrade rows of the results.
const upgradeScenario = "manager upgrade"

// deploydUpgrader replaces the agent: `deployd upgrade` (the new agent
// adopts the running workers).
type deploydUpgrader struct{ *deploydSystem }

func (s deploydUpgrader) reload(ctx context.Context, _ string) error {
	out, err := s.cli(ctx, 2*time.Minute, "upgrade")
	if err != nil {
		return fmt.Errorf("deployd upgrade: %w\n%s", err, out)
	}
	return s.waitReady(ctx, time.Minute)
}

// pm2Updater replaces the PM2 daemon: `pm2 update` (saves the process list,
// kills the daemon with its workers, starts a new one and resurrects them),
// then waits until every worker is online again.
type pm2Updater struct{ *pm2System }

func (s pm2Updater) reload(ctx context.Context, _ string) error {
	if s.poller != nil { // its connection goes with the old daemon
		s.poller.close()
		s.poller = nil
	}
	if out, err := s.pm2(ctx, 5*time.Minute, "update"); err != nil {
		return fmt.Errorf("pm2 update: %w\n%s", err, out)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ps, err := s.jlist(ctx)
		if err == nil && len(ps) == s.app.instances && allOnline(ps) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pm2 update: workers not all online after 1m")
}

// upgradesUnderLoad upgrades the manager itself b.reloads times under load:
// deployd upgrade against pm2 update, same app, same load.
func (b *bench) upgradesUnderLoad(ctx context.Context) error {
	for rep := range b.repeats {
		b.logf("manager upgrades under load, repeat %d/%d", rep+1, b.repeats)
		app := appSpec{kind: "node", instances: b.instances}
		ss := []reloader{deploydUpgrader{&deploydSystem{b: b, label: sysDeployd, app: app}}}
		if b.pm2 != "" {
			ss = append(ss, pm2Updater{&pm2System{b: b, app: app}})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error { return b.loadedRun(ctx, sys, rep, upgradeScenario, false) })
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) reportUpgrades(w io.Writer) {
	r := &b.res
	if len(r.vals(upgradeScenario, sysDeployd, "failed")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Manager upgrade under load (%d upgrades per run)\n\n", b.reloads)
	fmt.Fprintf(w, "`deployd upgrade` (the new agent adopts the workers) against `pm2 update` (the new daemon restarts them).\n\n")
	t := &table{head: []string{"system", "failed requests, total (per run)", "of which connect errors", "requests",
		"p99 ms keep-alive", "max ms", "one upgrade, s"}}
	for _, sys := range []string{sysPM2, sysDeployd} {
		if len(r.vals(upgradeScenario, sys, "failed")) == 0 {
			continue
		}
		t.row(sys, fmt.Sprintf("**%.0f** (%s)", sum(r.vals(upgradeScenario, sys, "failed")), mmm(r.vals(upgradeScenario, sys, "failed"), "%.0f")),
			fmt.Sprintf("%.0f", sum(r.vals(upgradeScenario, sys, "connect_errors"))),
			fmt.Sprintf("%.0f", sum(r.vals(upgradeScenario, sys, "requests"))),
			mmm(r.vals(upgradeScenario, sys, "p99"), "%.1f"), mmm(r.vals(upgradeScenario, sys, "max"), "%.0f"),
			mmm(r.vals(upgradeScenario, sys, "reload_s"), "%.2f"))
	}
	fmt.Fprintln(w, t)
}

// stop stops the agent that serves now (a descendant of the one started),
// then does what deploydSystem.stop does.
func (s deploydUpgrader) stop() error {
	if st, err := s.status(context.Background()); err == nil && st.Agent.PID != s.agent.pid() {
		_ = syscall.Kill(st.Agent.PID, syscall.SIGTERM)
		for deadline := time.Now().Add(60 * time.Second); alive(st.Agent.PID) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s.deploydSystem.stop()
}
