package integration

import (
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestAgentKillsAdoptWorkersUnderLoad SIGKILLs the agent five times under
// both loads, each time starting a new agent on the same config: every
// worker (an app whose SIGTERM cuts its connections, logging a numbered
// line every 20 ms) keeps serving and logging while no agent runs, and the
// next agent adopts it: no failed request, the same pids throughout, every
// tick line in the log exactly once.
func TestAgentKillsAdoptWorkersUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	const instances, kills = 2, 5
	a := NewAgentDir(t, bins, abruptApp(port, instances, ""))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := allWorkerPIDs(st)
	stop := startLoad(t, port, 4, 2*time.Minute)
	var worst time.Duration
	for i := range kills {
		pid := a.PID()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitExited(t, pid, 10*time.Second)
		t0 := time.Now()
		a.Start()
		st = a.WaitFor("workers adopted", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
		d := time.Since(t0)
		worst = max(worst, d)
		if now := allWorkerPIDs(st); !maps.Equal(now, before) {
			t.Fatalf("kill %d: workers %v, before the kill %v: not adopted\n%s", i+1, keys(now), keys(before), a.Log())
		}
		if r := appOf(st, "web").Restarts; r != 0 {
			t.Errorf("kill %d: %d restarts: a worker was replaced", i+1, r)
		}
		t.Logf("kill %d: agent %d SIGKILLed; the next agent serves with the same %d workers %s after its start",
			i+1, pid, len(before), d.Round(time.Millisecond))
	}
	ka, nka := stop()
	requireNoFailures(t, "5 agent SIGKILLs", ka, nka)
	a.Stop()
	lost := checkTicksAcrossKills(t, ticks(t, a.Dir), before, kills)
	t.Logf("%d agent SIGKILLs: same pids %v, slowest new agent serving %s after its start, %d tick lines lost",
		kills, keys(before), worst.Round(time.Millisecond), lost)
}

// checkTicksAcrossKills fails unless every tick line of each worker in pids
// is in the log exactly once, across the kills: what the killed agent had
// taken out of a pipe waits in the worker's journal, and the append it may
// have been making is found in the file or made again (logs.Journal). It
// returns how many are missing in all.
func checkTicksAcrossKills(t *testing.T, counts map[int]map[int]int, pids map[int]bool, kills int) (lost int) {
	t.Helper()
	for pid := range pids {
		c := counts[pid]
		top := 0
		for n := range c {
			top = max(top, n)
		}
		var missing, dup []int
		for n := 1; n <= top; n++ {
			switch c[n] {
			case 0:
				missing = append(missing, n)
			case 1:
			default:
				dup = append(dup, n)
			}
		}
		lost += len(missing)
		switch {
		case top == 0:
			t.Errorf("worker %d: no tick line in the log", pid)
		case len(dup) > 0 || len(missing) > 0:
			t.Errorf("worker %d: of ticks 1..%d (across %d kills), missing %v, repeated %v", pid, top, kills, missing, dup)
		default:
			t.Logf("worker %d: ticks 1..%d, each once", pid, top)
		}
	}
	return lost
}

// TestRealSystemdAgentKillsAdoptWorkers runs the agent as the unit that
// `deployd startup systemd` writes, under a real systemd, and SIGKILLs the
// unit's main process three times under both loads: KillMode=process
// leaves the workers alone, Restart= brings the next agent, which adopts
// them (0 failed requests, the same pids, every tick line once). Then
// `systemctl stop` still stops every worker through the agent.
func TestRealSystemdAgentKillsAdoptWorkers(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	const instances, kills = 2, 3
	a := NewAgentDir(t, bins, abruptApp(port, instances, ""))
	sd := bootSystemd(t, a.Dir, bins.Dir)
	a.Journal = func() string { return sd.journal("deployd") }
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config); err != nil {
		t.Fatalf("deployd startup systemd: %v\n%s", err, out)
	}
	sd.mustCtl("daemon-reload")
	sd.mustCtl("start", "deployd")
	st := a.WaitFor("ready under systemd", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	pids := PIDs(appOf(st, "web"))
	hostWorkers := map[int]bool{}
	for _, pid := range pids {
		if hp := sd.hostPID(pid); hp > 0 {
			hostWorkers[hp] = true
		}
	}
	if len(hostWorkers) != instances {
		t.Fatalf("found %d of the %d workers among the machine's pids", len(hostWorkers), instances)
	}

	stop := startLoad(t, port, 4, 3*time.Minute)
	var worst time.Duration
	for i := 1; i <= kills; i++ {
		old := sd.mainPID("deployd")
		if old != st.Agent.PID {
			t.Fatalf("MainPID %d, the agent reports pid %d", old, st.Agent.PID)
		}
		hp := sd.hostPID(old)
		if hp == 0 {
			t.Fatalf("the main pid %d is not among the machine's pids", old)
		}
		t0 := time.Now()
		if err := syscall.Kill(hp, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st = sd.nextAgent(a, old, instances)
		d := time.Since(t0)
		worst = max(worst, d)
		if got := PIDs(appOf(st, "web")); !maps.Equal(got, pids) {
			t.Fatalf("SIGKILL %d of the main pid replaced workers: %v, then %v\n%s", i, pids, got, sd.journal("deployd"))
		}
		t.Logf("SIGKILL %d of the main pid %d: agent %d serving with the same workers %s after the kill",
			i, old, st.Agent.PID, d.Round(time.Millisecond))
	}
	ka, nka := stop()
	requireNoFailures(t, "3 SIGKILLs of the unit's main pid", ka, nka)

	t1 := time.Now()
	sd.mustCtl("stop", "deployd")
	waitAllGone(t, hostWorkers, 30*time.Second)
	t.Logf("systemctl stop: every worker stopped, %s", time.Since(t1).Round(time.Millisecond))
	if out, _ := sd.ctl("is-active", "deployd"); strings.TrimSpace(out) != "inactive" {
		t.Errorf("after systemctl stop the unit is %q, want inactive", strings.TrimSpace(out))
	}
	j := sd.journal("deployd")
	if n := strings.Count(j, "taking over a worker left by an agent that died"); n != kills*instances {
		t.Errorf("the journal says %d workers were taken over, want %d:\n%s", n, kills*instances, j)
	}
	nspids := map[int]bool{} // the pids the workers print are those of systemd's namespace
	for _, pid := range pids {
		nspids[pid] = true
	}
	lost := checkTicksAcrossKills(t, ticks(t, a.Dir), nspids, kills)
	t.Logf("%d SIGKILLs of the main pid under systemd: same pids, slowest back to serving %s after the kill, %d tick lines lost",
		kills, worst.Round(time.Millisecond), lost)
}

// nextAgent waits until the agent Restart= starts after old was killed
// serves as the unit's main pid with n ready workers of web. No agent
// answers until then (RestartSec=1).
func (s *realSystemd) nextAgent(a *Agent, old, n int) *api.Status {
	s.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pid := agentPIDWithin(a); pid != 0 && pid != old {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no new agent 60s after agent %d was killed\n%s", old, s.journal("deployd"))
		}
	}
	return a.WaitFor("the next agent, started by Restart=", 60*time.Second, func(st *api.Status) bool {
		return st.Agent.PID != old && s.mainPID("deployd") == st.Agent.PID && AllReady(st, "web", n)
	})
}
