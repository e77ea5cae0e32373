package integration

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"golang.org/x/sys/unix"
)

func TestScaleUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 50, time.Minute)
	if r := a.CLI("scale", "web", "4"); r.Code != 0 {
		t.Fatalf("scale 4: exit %d\n%s", r.Code, r.Stderr)
	}
	st = a.Status()
	if !AllReady(st, "web", 4) {
		t.Fatalf("after scale 4: %+v", appOf(st, "web"))
	}
	after := PIDs(appOf(st, "web"))
	for slot, pid := range before {
		if after[slot] != pid {
			t.Errorf("scaling up replaced slot %d (%d -> %d)", slot, pid, after[slot])
		}
	}
	if r := a.CLI("scale", "web", "-3"); r.Code != 0 {
		t.Fatalf("scale -3: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLI("scale", "web", "+1"); r.Code != 0 {
		t.Fatalf("scale +1: exit %d\n%s", r.Code, r.Stderr)
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	st = a.Status()
	if !AllReady(st, "web", 2) || PIDs(appOf(st, "web"))[0] != before[0] {
		t.Errorf("after -3 and +1: %+v (slot 0 must keep pid %d)", appOf(st, "web"), before[0])
	}
	if r := a.CLI("scale", "web", "-5"); r.Code != 2 || !strings.Contains(r.Stderr, "at least 1") {
		t.Errorf("scale below 1: exit %d\n%s", r.Code, r.Stderr)
	}
	// The scaled count, not the config's 2, survives an agent restart.
	if r := a.CLI("scale", "web", "3"); r.Code != 0 {
		t.Fatalf("scale 3: exit %d\n%s", r.Code, r.Stderr)
	}
	a.Stop()
	a.Start()
	a.WaitFor("3 workers after restart (the scaled count)", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 3)
	})
}

func TestStopStartPersisted(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 1, ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	pid := PIDs(appOf(st, "web"))[0]
	if r := a.CLI("stop", "web"); r.Code != 0 {
		t.Fatalf("stop: exit %d\n%s", r.Code, r.Stderr)
	}
	if app := a.App("web"); app.State != "stopped" || len(app.Workers) != 0 || Alive(pid) {
		t.Fatalf("after stop: %+v (pid %d alive %v)", app, pid, Alive(pid))
	}
	a.Stop()
	a.Start()
	if app := a.App("web"); app.State != "stopped" || len(app.Workers) != 0 {
		t.Fatalf("a stopped app must stay stopped after an agent restart: %+v", app)
	}
	if r := a.CLI("start", "web"); r.Code != 0 {
		t.Fatalf("start: exit %d\n%s", r.Code, r.Stderr)
	}
	a.WaitFor("running", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	if _, err := get(t, port, "/"); err != nil {
		t.Fatal(err)
	}
}

func TestMaxMemoryReplacesWorkerGracefully(t *testing.T) {
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, `max_memory = "150MiB"`))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 50, time.Minute)
	// Make one worker allocate past the limit.
	body, err := get(t, port, "/alloc?mb=200")
	if err != nil {
		t.Fatalf("alloc: %v %s", err, body)
	}
	st = a.WaitFor("the big worker replaced", 30*time.Second, func(st *api.Status) bool {
		app := appOf(st, "web")
		replaced := 0
		for _, w := range app.Workers {
			replaced += w.MemoryReplacements
		}
		return replaced == 1 && AllReady(st, "web", 2)
	})
	ka, nka := stop()
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	after := PIDs(appOf(st, "web"))
	changed := 0
	for slot := range before {
		if after[slot] != before[slot] {
			changed++
		}
	}
	if changed != 1 {
		t.Errorf("want exactly one worker replaced, before %v after %v", before, after)
	}
	if !strings.Contains(a.Log(), "max_memory") {
		t.Errorf("the replacement is not logged")
	}
}

func TestWatchdogReplacesHungWorker(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, `watchdog = "1s"
stop_timeout = "1s"`))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	if err := syscall.Kill(before[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	st = a.WaitFor("hung worker replaced", 30*time.Second, func(st *api.Status) bool {
		p := PIDs(appOf(st, "web"))
		return AllReady(st, "web", 2) && p[1] != before[1]
	})
	if p := PIDs(appOf(st, "web")); p[0] != before[0] {
		t.Errorf("the healthy worker was replaced too: %v -> %v", before, p)
	}
	deadline := time.Now().Add(10 * time.Second)
	for Alive(before[1]) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if Alive(before[1]) {
		t.Errorf("the hung worker %d is still there", before[1])
	}
}

func TestReloadOfOneAppLeavesOthersAlone(t *testing.T) {
	parallel(t)
	p1, p2 := FreePort(t), FreePort(t)
	cfg := func(ver string) string {
		return versionedApp(p1, 2, ver, "", "") + appConfig("api", p2, 2, "")
	}
	a := StartAgent(t, bins, cfg("v1"))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 2) && AllReady(st, "api", 2)
	})
	apiBefore := PIDs(appOf(st, "api"))
	a.WriteConfig(cfg("v2"))
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload web: exit %d\n%s", r.Code, r.Stderr)
	}
	st = a.Status()
	if after := PIDs(appOf(st, "api")); fmt.Sprint(after) != fmt.Sprint(apiBefore) {
		t.Errorf("reloading web changed api's workers: %v -> %v", apiBefore, after)
	}
	for _, v := range identities(t, p1, PIDs(appOf(st, "web"))) {
		if v != "v2" {
			t.Errorf("web answers %s after its reload", v)
		}
	}
}

func TestCPUAffinityPinsSlots(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	usable := usableCPUs(t)
	if len(usable) < 2 {
		skipOrFail(t, fmt.Sprintf("pinning needs 2 usable CPUs to tell slots apart, have %v", usable))
	}
	a := StartAgent(t, bins, appConfig("web", port, 2, "cpu_affinity = true"))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	for slot, pid := range PIDs(appOf(st, "web")) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		var allowed string
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				allowed = strings.TrimSpace(v)
			}
		}
		if want := fmt.Sprint(usable[slot%len(usable)]); allowed != want {
			t.Errorf("slot %d (pid %d) is allowed on %q, want CPU %s (usable CPUs %v)", slot, pid, allowed, want, usable)
		}
	}
}

// usableCPUs lists the CPUs this process may run on, in order.
func usableCPUs(t *testing.T) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}
