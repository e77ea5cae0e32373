package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// versionedApp is the web app at version ver with extra env entries.
func versionedApp(port, instances int, ver, env, extra string) string {
	e := fmt.Sprintf(`TESTAPP_VERSION = %q`, ver)
	if env != "" {
		e += ", " + env
	}
	return appConfig("web", port, instances, fmt.Sprintf("env = { %s }\n%s", e, extra))
}

func TestReloadsUnderLoadDropNothing(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	const instances = 2
	a := StartAgent(t, bins, versionedApp(port, instances, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	stop := startLoad(t, port, 50, 3*time.Minute)
	var durations []time.Duration
	for i := 1; i <= 10; i++ {
		ver := "v1"
		if i%2 == 1 {
			ver = "v2"
		}
		a.WriteConfig(versionedApp(port, instances, ver, "", ""))
		t0 := time.Now()
		r := a.CLI("reload", "web")
		durations = append(durations, time.Since(t0))
		if testing.Verbose() {
			t.Logf("reload %d:\n%s", i, r.Stderr)
		}
		if r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s", i, r.Code, r.Stderr)
		}
		st := a.Status()
		app := appOf(st, "web")
		if !AllReady(st, "web", instances) {
			t.Fatalf("after reload %d: %+v", i, app)
		}
		for pid, v := range identities(t, port, PIDs(app)) {
			if v != ver {
				t.Errorf("after reload %d, worker %d answers %s, want %s", i, pid, v, ver)
			}
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	t.Logf("reload durations: %v", durations)
}

func TestReloadAbandonedWhenNewVersionExits(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 50, time.Minute)
	a.WriteConfig(versionedApp(port, 2, "v2", `TESTAPP_EXIT_BEFORE_READY = "4"`, ""))
	r := a.CLI("reload", "web")
	ka, nka := stop()
	if r.Code != 1 {
		t.Fatalf("reload of a version that exits: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
	for _, want := range []string{"abandoned", "exit status 4", "previous version still serving", "started version=v2"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("reload output lacks %q:\n%s", want, r.Stderr)
		}
	}
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	after := PIDs(a.App("web"))
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("old workers must be untouched: before %v, after %v", before, after)
	}
	for _, v := range identities(t, port, after) {
		if v != "v1" {
			t.Errorf("a worker answers %s after an abandoned reload", v)
		}
	}
}

func TestReloadAbandonedWhenNeverReady(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", `ready_timeout = "1500ms"`))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 50, time.Minute)
	a.WriteConfig(versionedApp(port, 2, "v2", `TESTAPP_NEVER_READY = "true"`, `ready_timeout = "1500ms"`))
	t0 := time.Now()
	r := a.CLI("reload", "web", "--json")
	took := time.Since(t0)
	ka, nka := stop()
	if r.Code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if took < 1500*time.Millisecond {
		t.Errorf("abandoned after %s, before ready_timeout", took)
	}
	// --json: events, then one result object.
	var last map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.Stdout))
	lines := 0
	for sc.Scan() {
		lines++
		last = nil
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatalf("--json line %d is not JSON: %q", lines, sc.Text())
		}
	}
	apps, _ := last["apps"].([]any)
	if lines < 2 || len(apps) != 1 || apps[0].(map[string]any)["outcome"] != "abandoned" {
		t.Errorf("--json should end with a result whose outcome is abandoned:\n%s", r.Stdout)
	}
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("old workers must be untouched: before %v, after %v", before, after)
	}
}

func TestReloadWithSlowStartingVersion(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, port, 50, time.Minute)
	a.WriteConfig(versionedApp(port, 2, "v2", `TESTAPP_STARTUP_DELAY = "3s"`, ""))
	r := a.CLI("reload", "web")
	ka, nka := stop()
	if r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	}
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	for _, w := range a.App("web").Workers {
		if w.ReadyMillis < 3000 {
			t.Errorf("worker %d ready after %d ms, but the app needs 3 s", w.Slot, w.ReadyMillis)
		}
	}
}

func TestBlueGreenReload(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, port, 50, time.Minute)
	a.WriteConfig(versionedApp(port, 2, "v2", "", ""))
	r := a.CLI("reload", "web", "--strategy", "blue-green", "--json")
	ka, nka := stop()
	if r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	}
	// Every new worker is ready before the first old one drains.
	var events []api.Event
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		var e api.Event
		if json.Unmarshal([]byte(line), &e) == nil && e.Type != "" {
			events = append(events, e)
		}
	}
	readies, firstDrain := 0, -1
	for i, e := range events {
		if e.Type == "ready" && firstDrain < 0 {
			readies++
		}
		if e.Type == "draining" && firstDrain < 0 {
			firstDrain = i
		}
	}
	if readies != 2 || firstDrain < 0 {
		t.Errorf("blue-green: want 2 ready events before the first drain, events: %+v", events)
	}
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	// The new version serves afterwards, from two new workers only.
	st := a.Status()
	if !AllReady(st, "web", 2) {
		t.Fatalf("after the blue-green reload: %+v", appOf(st, "web"))
	}
	for pid, v := range identities(t, port, PIDs(appOf(st, "web"))) {
		if v != "v2" {
			t.Errorf("after the blue-green reload, worker %d answers %s, want v2", pid, v)
		}
	}
}

func TestConcurrentReloadIsRefused(t *testing.T) {
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 1, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	a.WriteConfig(versionedApp(port, 1, "v2", `TESTAPP_STARTUP_DELAY = "2s"`, ""))
	var first Result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); first = a.CLI("reload", "web") }()
	a.WaitFor("reload running", 10*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "reloading" })
	t0 := time.Now()
	second := a.CLI("reload", "web")
	if second.Code != 1 || !strings.Contains(second.Stderr, "another reload") {
		t.Errorf("second reload: exit %d, want 1 with a clear message:\n%s", second.Code, second.Stderr)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("second reload took %s; it must be refused at once", d)
	}
	wg.Wait()
	if first.Code != 0 {
		t.Errorf("first reload: exit %d\n%s", first.Code, first.Stderr)
	}
}

func TestReloadWithInvalidConfigChangesNothing(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	a.WriteConfig(versionedApp(port, 2, "v2", "", `ready_timeout = "soon"`))
	r := a.CLI("reload", "web")
	if r.Code != 2 || !strings.Contains(r.Stderr, "ready_timeout") || !strings.Contains(r.Stderr, "nothing was changed") {
		t.Errorf("reload with a bad config: exit %d, want 2 naming the key:\n%s", r.Code, r.Stderr)
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("workers changed: before %v, after %v", before, after)
	}
	a.WriteConfig(versionedApp(port, 2, "v1", "", ""))
	if r := a.CLI("reload", "nosuchapp"); r.Code != 2 || !strings.Contains(r.Stderr, "unknown app") {
		t.Errorf("reload of an unknown app: exit %d\n%s", r.Code, r.Stderr)
	}
}

func TestReloadScalesAndShowsGenerations(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 1, "v1", "", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	gen := appOf(st, "web").Workers[0].Generation
	stop := startLoad(t, port, 50, time.Minute)
	a.WriteConfig(versionedApp(port, 3, "v2", "", ""))
	if r := a.CLI("reload"); r.Code != 0 {
		t.Fatalf("grow: exit %d\n%s", r.Code, r.Stderr)
	}
	st = a.Status()
	if !AllReady(st, "web", 3) {
		t.Fatalf("after growing: %+v", appOf(st, "web"))
	}
	for _, w := range appOf(st, "web").Workers {
		if w.Generation <= gen {
			t.Errorf("worker %d generation %d, want > %d", w.Slot, w.Generation, gen)
		}
	}
	a.WriteConfig(versionedApp(port, 2, "v1", "", ""))
	if r := a.CLI("reload"); r.Code != 0 {
		t.Fatalf("shrink: exit %d\n%s", r.Code, r.Stderr)
	}
	ka, nka := stop()
	if st := a.Status(); !AllReady(st, "web", 2) {
		t.Fatalf("after shrinking: %+v", appOf(st, "web"))
	}
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
}
