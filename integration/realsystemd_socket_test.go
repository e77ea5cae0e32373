package integration

import (
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestRealSystemdSocketUnits runs the units `deployd startup systemd
// --socket-unit` writes under a real systemd: the agent gets web's
// listener from the socket unit (LISTEN_FDS) and serves it; two SIGKILLs
// of the main pid, then a SIGKILL of the new and of the old agent during a
// `systemctl reload`, under both loads, keep the same workers serving (0
// failed, each tick line once); `systemctl restart`, which replaces the
// workers, refuses no connection: they wait in the socket unit's queue.
func TestRealSystemdSocketUnits(t *testing.T) {
	port := FreePort(t)
	const n, kills = 2, 2
	a := NewAgentDir(t, bins, appConfig("web", port, n, `env = { TESTAPP_TICK = "20ms" }`))
	sd := bootSystemd(t, a.Dir, bins.Dir)
	a.Journal = func() string { return sd.journal("deployd") }
	defer func() {
		if t.Failed() {
			t.Logf("journal of deployd:\n%s", sd.journal("deployd"))
		}
	}()
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config, "--socket-unit"); err != nil {
		t.Fatalf("deployd startup systemd --socket-unit: %v\n%s", err, out)
	}
	// A handoff takes milliseconds on a quiet machine: the failpoint keeps
	// both agents alive for 3 s, so that the kills below land during one.
	// The test kills agents faster than systemd's default start limit (5
	// starts in 10 s) allows restarts: no limit here.
	hold := func(d string) {
		t.Helper()
		if out, err := sd.run("sh", "-c", "mkdir -p /etc/systemd/system/deployd.service.d && "+
			"printf '[Unit]\\nStartLimitIntervalSec=0\\n[Service]\\nEnvironment=DEPLOYD_TEST_HANDOFF_HOLD="+d+"\\n' > /etc/systemd/system/deployd.service.d/hold.conf"); err != nil {
			t.Fatalf("write the unit's drop-in: %v\n%s", err, out)
		}
		sd.mustCtl("daemon-reload")
	}
	hold("3s")
	sd.mustCtl("start", "deployd")
	st := a.WaitFor("ready under systemd", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
	if out, _ := sd.ctl("is-active", "deployd-web.socket"); strings.TrimSpace(out) != "active" {
		t.Fatalf("deployd-web.socket is %q, want active", strings.TrimSpace(out))
	}
	if j := sd.journal("deployd"); !strings.Contains(j, "adopted socket from systemd socket activation") {
		t.Fatalf("the agent did not take web's listener from the socket unit:\n%s", j)
	}
	if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "version=v1") {
		t.Fatalf("GET /: %q, %v", body, err)
	}
	pids := PIDs(appOf(st, "web"))

	stop := startLoad(t, port, 4, 3*time.Minute)
	for i := 1; i <= kills; i++ {
		old := sd.mainPID("deployd")
		hp := sd.hostPID(old)
		if hp == 0 {
			t.Fatalf("the main pid %d is not among the machine's pids", old)
		}
		t0 := time.Now()
		if err := syscall.Kill(hp, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		st = sd.nextAgent(a, old, n)
		if got := PIDs(appOf(st, "web")); !maps.Equal(got, pids) {
			t.Fatalf("SIGKILL %d of the main pid replaced workers: %v, then %v\n%s", i, pids, got, sd.journal("deployd"))
		}
		t.Logf("SIGKILL %d of the main pid %d: agent %d serving with the same workers %s after the kill",
			i, old, st.Agent.PID, time.Since(t0).Round(time.Millisecond))
	}
	// systemctl reload hands off to a new agent; SIGKILL the new one while
	// it takes over, then, in the next reload, the old one; then the old one
	// again, before the new one told systemd its pid (systemd sees its main
	// pid die and starts another agent: the new one must leave it the
	// control socket and the workers). The new agent inherits the old one's
	// environment: the agent that Restart= starts after "old" is the first
	// with the drop-in's "before:".
	for _, victim := range []string{"new", "old", "old, before systemd knew the new one"} {
		if victim == "old" {
			hold("before:2s")
		}
		old := sd.mainPID("deployd")
		hp := sd.hostPID(old)
		sd.mustCtl("reload", "deployd")
		child := waitChild(t, hp, 20*time.Second)
		pid := child
		if victim != "new" {
			pid = hp
		}
		t0 := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if victim == "new" {
			// ... and done with the upgrade that failed: until it has said
			// so, the next SIGHUP finds an upgrade in flight and is refused.
			// The new agent had told systemd it was the main pid: the old
			// one says it is again, or the next reload's kill -HUP would
			// find the main pid dead and systemd would start another agent.
			st = a.WaitFor("the old agent serving on, its upgrade given up", 30*time.Second, func(st *api.Status) bool {
				return st.Agent.PID == old && !Alive(child) && AllReady(st, "web", n) &&
					strings.Contains(sd.journal("deployd"), "upgrade refused or failed") &&
					sd.mainPID("deployd") == old
			})
		} else {
			// The new agent exits (whether or not systemd took its pid, it
			// cannot know), leaving the workers to the agent systemd starts.
			waitExited(t, child, 30*time.Second)
			st = sd.nextAgent(a, old, n)
		}
		if got := PIDs(appOf(st, "web")); !maps.Equal(got, pids) {
			t.Fatalf("SIGKILL of the %s agent during systemctl reload replaced workers: %v, then %v\n%s",
				victim, pids, got, sd.journal("deployd"))
		}
		t.Logf("systemctl reload, %s agent SIGKILLed during it: agent %d (MainPID %d) serves with the same workers %s after the kill",
			victim, st.Agent.PID, sd.mainPID("deployd"), time.Since(t0).Round(time.Millisecond))
	}
	ka, nka := stop()
	requireNoFailures(t, fmt.Sprintf("%d SIGKILLs of the main pid and 3 during systemctl reload, with a socket unit", kills), ka, nka)

	stop = startLoad(t, port, 8, time.Minute)
	t1 := time.Now()
	sd.mustCtl("restart", "deployd")
	st = a.WaitFor("ready after restart", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
	took := time.Since(t1)
	ka, nka = stop()
	t.Logf("systemctl restart with a socket unit: serving again after %s; keep-alive %s; new-connection %s",
		took.Round(time.Millisecond), ka, nka)
	if ka.Refused+nka.Refused != 0 {
		t.Errorf("systemctl restart with a socket unit: %d connections refused; the socket unit holds the listener",
			ka.Refused+nka.Refused)
	}
	sd.mustCtl("stop", "deployd")
	nspids := map[int]bool{}
	for _, pid := range pids {
		nspids[pid] = true
	}
	checkTicksAcrossKills(t, ticks(t, a.Dir), nspids, kills)
}
