package integration

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// Under a real systemd, with the unit `deployd startup systemd` writes
// (KillMode=process, Delegate=yes): each worker runs in a cgroup of its own
// under the unit's; a SIGKILL of the unit's main pid leaves the workers,
// their setsid children and their cgroups alone; the next agent (Restart=)
// adopts them and finds their cgroups again, and a reload then leaves none
// of the old release's children; systemctl stop leaves none of the new.
func TestRealSystemdAgentKillThenReloadSweepsSetsidChildren(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, "")
	// Folders systemd's root (an overlay of the machine's) sees.
	d1, d2 := filepath.Join(a.Dir, "d1"), filepath.Join(a.Dir, "d2")
	for _, d := range []string{d1, d2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a.WriteConfig(daemonApp(port, 2, "v1", d1))
	sd := bootSystemd(t, a.Dir, bins.Dir)
	a.Journal = func() string { return sd.journal("deployd") }
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config); err != nil {
		t.Fatalf("deployd startup systemd: %v\n%s", err, out)
	}
	sd.mustCtl("daemon-reload")
	sd.mustCtl("start", "deployd")
	st := a.WaitFor("ready under systemd", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	pids := PIDs(appOf(st, "web"))
	// The pids the children wrote are those of systemd's pid namespace.
	hostOf := func(nspids []int) []int {
		var out []int
		for _, p := range nspids {
			if hp := sd.hostPID(p); hp > 0 {
				out = append(out, hp)
			}
		}
		if len(out) != len(nspids) {
			t.Fatalf("found %d of the pids %v among the machine's", len(out), nspids)
		}
		killOnCleanup(t, out)
		return out
	}
	daemonsNS, _, oldNS := leftPIDs(t, d1, 2)
	old, daemons := hostOf(oldNS), hostOf(daemonsNS)
	for _, p := range old {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cgroup")
		if !strings.Contains(string(b), "/deployd.service/deployd-worker-web-") {
			t.Errorf("setsid child %d is not in a worker's cgroup under the unit's: %s", p, b)
		}
	}

	main := sd.mainPID("deployd")
	hp := sd.hostPID(main)
	if hp == 0 {
		t.Fatalf("the main pid %d is not among the machine's pids", main)
	}
	if err := syscall.Kill(hp, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = sd.nextAgent(a, main, 2)
	if got := PIDs(appOf(st, "web")); !maps.Equal(got, pids) {
		t.Fatalf("the SIGKILL of the main pid replaced workers: %v, then %v\n%s", pids, got, sd.journal("deployd"))
	}
	for _, p := range old {
		if !Alive(p) {
			t.Fatalf("setsid child %d of a running worker died with the agent\n%s", p, sd.journal("deployd"))
		}
	}

	a.WriteConfig(daemonApp(port, 2, "v2", d2))
	if r := a.CLIWithin(time.Minute, "reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s\n%s", r.Code, r.Stderr, sd.journal("deployd"))
	}
	requireGone(t, "when the reload returned", daemons)
	res := requireOnly(t, a, port, "v2")
	oldWorkers := map[int]bool{}
	for _, w := range pids {
		oldWorkers[sd.hostPID(w)] = true
	}
	waitAllGone(t, oldWorkers, 30*time.Second)
	requireGone(t, "once the old workers exited", old)
	_, _, newNS := leftPIDs(t, d2, 2)
	cur := hostOf(newNS)

	sd.mustCtl("stop", "deployd")
	requireGone(t, "after systemctl stop", cur)
	j := sd.journal("deployd")
	n := strings.Count(j, "left a process running; killed it")
	if n < 2 {
		t.Errorf("the journal names %d swept processes, want the 2 sleeps at least:\n%s", n, j)
	}
	t.Logf("under systemd, after a SIGKILL of the agent: a reload over the old release's %d setsid children "+
		"(%d processes named as swept in the journal in all); a load after it: %s", len(old), n, res)
}
