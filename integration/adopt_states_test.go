package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// controlTimeout bounds the control calls these tests make themselves.
const controlTimeout = 10 * time.Second

// agentPIDWithin is the pid answering the control socket (0: none yet).
func agentPIDWithin(a *Agent) int {
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	v, err := a.Client.Version(ctx)
	if err != nil {
		return 0
	}
	return v.PID
}

// upgradeWithin runs one agent upgrade of kind "cli" (deployd upgrade),
// "binary" (deployd upgrade --binary) or "sighup" (kill -HUP, what
// `systemctl reload` runs) and waits until the old agent is gone.
func upgradeWithin(t *testing.T, a *Agent, kind string) {
	t.Helper()
	old := agentPIDWithin(a)
	if old == 0 {
		t.Fatalf("no agent answers before the %s upgrade\n%s", kind, a.Log())
	}
	switch kind {
	case "binary":
		cand := filepath.Join(t.TempDir(), "deployd-new")
		CopyFile(t, a.bins.DeploydV2, cand)
		if r := a.CLIWithin(2*time.Minute, "upgrade", "--binary", cand); r.Code != 0 {
			t.Fatalf("upgrade --binary: exit %d\n%s\nagent log:\n%s", r.Code, r.Stderr, a.Log())
		}
	case "cli":
		if r := a.CLIWithin(2*time.Minute, "upgrade"); r.Code != 0 {
			t.Fatalf("upgrade: exit %d\n%s\nagent log:\n%s", r.Code, r.Stderr, a.Log())
		}
	case "sighup":
		if err := syscall.Kill(old, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pid := agentPIDWithin(a); pid != 0 && pid != old && !Alive(old) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s upgrade: agent %d still there after 60s (alive %v)\n%s", kind, old, Alive(old), a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statesConfig has four apps: web (healthy, under load), bad (its worker
// exits 0.3 s after it starts, before it is ready: it crash-loops with
// backoff), broken (errored after 2 crashes) and idle (stopped by `deployd
// stop` once one of its workers was killed).
func statesConfig(web, bad, broken, idle int) string {
	return appConfig("web", web, 2, "") +
		appConfig("bad", bad, 1, `env = { TESTAPP_STARTUP_DELAY = "300ms", TESTAPP_EXIT_BEFORE_READY = "3" }
[apps.bad.restart]
backoff = "400ms"
max_backoff = "800ms"
max_restarts = 100000
window = "1m"`) +
		appConfig("broken", broken, 1, `env = { TESTAPP_EXIT_BEFORE_READY = "7" }
[apps.broken.restart]
backoff = "10ms"
max_backoff = "20ms"
max_restarts = 2
window = "10m"`) +
		appConfig("idle", idle, 1, "")
}

// setUpStates waits until web is ready, bad has restarted, broken is
// errored, and idle is stopped with one crash recorded.
func setUpStates(t *testing.T, a *Agent) {
	t.Helper()
	st := a.WaitFor("web and idle ready, broken errored, bad restarting", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 2) && AllReady(st, "idle", 1) && appOf(st, "broken").State == "errored" &&
			appOf(st, "bad").Restarts >= 2
	})
	idle := appOf(st, "idle").Workers[0].PID
	if err := syscall.Kill(idle, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.WaitFor("idle restarted once", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "idle", 1) && appOf(st, "idle").Restarts == 1
	})
	if r := a.CLIWithin(time.Minute, "stop", "idle"); r.Code != 0 {
		t.Fatalf("stop idle: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	a.WaitFor("idle stopped", 20*time.Second, func(st *api.Status) bool { return appOf(st, "idle").State == "stopped" })
}

// checkStatesKept compares each app's status after an upgrade with before.
func checkStatesKept(t *testing.T, step string, before, after *api.Status) {
	t.Helper()
	web0, web1 := appOf(before, "web"), appOf(after, "web")
	if web1.State != "running" || !samePIDs(allWorkerPIDs(&api.Status{Apps: []api.App{web0}}), allWorkerPIDs(&api.Status{Apps: []api.App{web1}})) ||
		web1.Restarts != web0.Restarts {
		t.Errorf("%s: web %s, pids %v, restarts %d; before: %s, pids %v, restarts %d", step,
			web1.State, PIDs(web1), web1.Restarts, web0.State, PIDs(web0), web0.Restarts)
	}
	bad0, bad1 := appOf(before, "bad"), appOf(after, "bad")
	if bad1.State != "running" || bad1.Restarts < bad0.Restarts || bad1.LastExit == "" {
		t.Errorf("%s: bad %s, restarts %d, last exit %q; before: %s, restarts %d (the count must go on, not start over)",
			step, bad1.State, bad1.Restarts, bad1.LastExit, bad0.State, bad0.Restarts)
	}
	for _, name := range []string{"broken", "idle"} {
		x0, x1 := appOf(before, name), appOf(after, name)
		if x1.State != x0.State || x1.Restarts != x0.Restarts || x1.LastExit != x0.LastExit {
			t.Errorf("%s: %s %s, restarts %d, last exit %q; before: %s, %d, %q", step, name,
				x1.State, x1.Restarts, x1.LastExit, x0.State, x0.Restarts, x0.LastExit)
		}
		for _, w := range x1.Workers {
			if w.State != "exited" {
				t.Errorf("%s: %s is %s but its worker %d (pid %d) is %s", step, name, x1.State, w.Slot, w.PID, w.State)
			}
		}
	}
}

// TestUpgradeTakesEveryAppOverAsItIs: one healthy app under load, one
// crash-looping, one errored and one stopped; upgrades by `deployd
// upgrade`, SIGHUP and `deployd upgrade --binary` all succeed, the healthy
// app loses no request and keeps its pids, the others keep their state and
// counters (the crash loop's go on under the new agent).
func TestUpgradeTakesEveryAppOverAsItIs(t *testing.T) {
	parallelUnderLoad(t)
	web, bad, broken, idle := FreePort(t), FreePort(t), FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, statesConfig(web, bad, broken, idle))
	a.UseOwnBinary()
	a.Start()
	setUpStates(t, a)
	stop := startLoad(t, web, 20, 2*time.Minute)
	first := a.Status()
	for i, kind := range []string{"cli", "sighup", "binary"} {
		before := a.Status()
		t0 := time.Now()
		upgradeWithin(t, a, kind)
		took := time.Since(t0)
		after := a.Status()
		checkStatesKept(t, fmt.Sprintf("upgrade %d (%s)", i+1, kind), before, after)
		t.Logf("upgrade %d (%s) in %v: %s", i+1, kind, took.Round(time.Millisecond), summary(before, after))
	}
	// The crash loop goes on under the last agent, from its count.
	n := appOf(a.Status(), "bad").Restarts
	a.WaitFor("bad restarted under the new agent", 20*time.Second, func(st *api.Status) bool {
		return appOf(st, "bad").Restarts >= n+2
	})
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	last := a.Status()
	if !samePIDs(allWorkerPIDs(&api.Status{Apps: []api.App{appOf(first, "web")}}),
		allWorkerPIDs(&api.Status{Apps: []api.App{appOf(last, "web")}})) {
		t.Errorf("web pids %v after 3 upgrades, want %v", PIDs(appOf(last, "web")), PIDs(appOf(first, "web")))
	}
	t.Logf("3 upgrades: web pids %v kept; bad restarts %d -> %d; load: keep-alive %s; new-connection %s",
		PIDs(appOf(last, "web")), appOf(first, "bad").Restarts, appOf(last, "bad").Restarts, ka, nka)
}

// summary is each app's state and restarts before -> after.
func summary(before, after *api.Status) string {
	var parts []string
	for _, b := range before.Apps {
		x := appOf(after, b.Name)
		parts = append(parts, fmt.Sprintf("%s %s/%d -> %s/%d (last exit %q -> %q)", b.Name, b.State, b.Restarts,
			x.State, x.Restarts, b.LastExit, x.LastExit))
	}
	return strings.Join(parts, "; ")
}

// TestSystemdReloadTakesEveryAppOverAsItIs is the systemd path: the agent
// runs under socket activation (web's socket comes from "systemd") with a
// NOTIFY_SOCKET, and each reload is what `systemctl reload` runs,
// ExecReload=/bin/kill -HUP $MAINPID, with MAINPID the last one the agent
// announced. Twice: the second reload reaches the agent that took over.
func TestSystemdReloadTakesEveryAppOverAsItIs(t *testing.T) {
	parallelUnderLoad(t)
	web, bad, broken, idle := FreePort(t), FreePort(t), FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, statesConfig(web, bad, broken, idle))
	notify := listenNotify(t, a.Dir)
	startActivated(t, a, fmt.Sprintf("127.0.0.1:%d", web), "web", "NOTIFY_SOCKET="+notify.path)
	setUpStates(t, a)
	stop := startLoad(t, web, 20, 2*time.Minute)
	first := a.Status()
	mainPID := agentPIDWithin(a)
	notify.wait(t, fmt.Sprintf(`(?m)^MAINPID=%d$`, mainPID))
	for i := 1; i <= 2; i++ {
		before := a.Status()
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
		out, err := exec.CommandContext(ctx, "/bin/kill", "-HUP", fmt.Sprint(mainPID)).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("kill -HUP $MAINPID (%d): %v %s", mainPID, err, out)
		}
		deadline := time.Now().Add(60 * time.Second)
		for pid := agentPIDWithin(a); pid == 0 || pid == mainPID || Alive(mainPID); pid = agentPIDWithin(a) {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d: agent %d still serving 60s after SIGHUP\n%s", i, mainPID, a.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(t0)
		mainPID = agentPIDWithin(a)
		notify.wait(t, fmt.Sprintf(`(?m)^READY=1$[\s\S]*^MAINPID=%d$`, mainPID))
		after := a.Status()
		checkStatesKept(t, fmt.Sprintf("systemctl reload %d", i), before, after)
		t.Logf("systemctl reload %d in %v (MAINPID now %d): %s", i, took.Round(time.Millisecond), mainPID, summary(before, after))
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	last := a.Status()
	if !samePIDs(allWorkerPIDs(&api.Status{Apps: []api.App{appOf(first, "web")}}),
		allWorkerPIDs(&api.Status{Apps: []api.App{appOf(last, "web")}})) {
		t.Errorf("web pids %v after 2 reloads, want %v", PIDs(appOf(last, "web")), PIDs(appOf(first, "web")))
	}
	t.Logf("2 systemctl reloads: web pids %v kept; load: keep-alive %s; new-connection %s", PIDs(appOf(last, "web")), ka, nka)
}

// TestUpgradeRefusedMidOperation: an app in the middle of a reload has no
// state to hand over: the upgrade is refused up front, naming the app and
// what to do, and nothing changes; once the reload is done the upgrade
// goes through.
func TestUpgradeRefusedMidOperation(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 1, ""))
	a.UseOwnBinary()
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	old := agentPIDWithin(a)
	a.WriteConfig(appConfig("web", port, 1, `env = { TESTAPP_STARTUP_DELAY = "3s" }`))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reload := exec.CommandContext(ctx, a.bins.Deployd, "reload", "web")
	reload.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	if err := reload.Start(); err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan error, 1)
	go func() { reloaded <- reload.Wait() }()
	a.WaitFor("web reloading", 20*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "reloading" })
	r := a.CLIWithin(time.Minute, "upgrade")
	t.Logf("upgrade during the reload: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	if r.Code == 0 || !strings.Contains(r.Stderr, "app web") || !strings.Contains(r.Stderr, "wait for it to finish") {
		t.Errorf("upgrade during a reload: exit %d, %q; want a refusal naming the app and what to do", r.Code, r.Stderr)
	}
	if pid := agentPIDWithin(a); pid != old {
		t.Fatalf("agent %d serves after the refused upgrade, want %d", pid, old)
	}
	select {
	case err := <-reloaded:
		if err != nil {
			t.Fatalf("reload: %v\n%s", err, a.Log())
		}
	case <-ctx.Done():
		t.Fatalf("reload did not end within a minute\n%s", a.Log())
	}
	upgradeWithin(t, a, "cli")
	a.WaitFor("ready after the upgrade", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
}
