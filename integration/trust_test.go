package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// A release that prints its ready line and exits 0 right after is not
// trusted: min_ready (default 1 s) catches it, the reload exits 1 and the
// old workers, untouched, serve on. (Requests the dying release accepted
// in its 200 ms die with it, as they would anywhere: the load during the
// reload is logged, and the load after it must see only the old version.)
func TestReloadRefusedWhenReadyThenExit(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 20, time.Minute)
	a.WriteConfig(versionedApp(port, 2, "v2", `TESTAPP_CRASH_AFTER = "200ms", TESTAPP_CRASH_CODE = "0"`, ""))
	r := a.CLI("reload", "web")
	ka, nka := stop()
	t.Logf("during the reload: keep-alive %s; new-connection %s", ka, nka)
	if r.Code != 1 {
		t.Fatalf("reload of a release that exits 0 after ready: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
	for _, want := range []string{"abandoned", "after it was ready", "exit status 0", "previous version still serving"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("reload output lacks %q:\n%s", want, r.Stderr)
		}
	}
	after := PIDs(a.App("web"))
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("old workers must be untouched: before %v, after %v", before, after)
	}
	stop = startLoad(t, port, 20, 2*time.Second)
	time.Sleep(time.Second)
	ka, nka = stop()
	requireNoFailures(t, "keep-alive after the refused reload", ka)
	requireNoFailures(t, "new-connection after the refused reload", nka)
	for _, res := range []loadgen.Result{ka, nka} {
		if len(res.Versions) != 1 || res.Versions["v1"] == 0 {
			t.Errorf("after the refused reload the load saw versions %v, want only v1", res.Versions)
		}
	}
}

var (
	goAppOnce sync.Once
	goAppPath string
	goAppErr  error
)

// goApp builds integration/goapp (the Go guide's example) once.
func goApp(t *testing.T) string {
	t.Helper()
	goAppOnce.Do(func() { goAppPath, goAppErr = Build(bins.Dir, "goapp", "./integration/goapp", "") })
	if goAppErr != nil {
		t.Fatal(goAppErr)
	}
	return goAppPath
}

// goAppConfig is the web app running the package-worker example at ver.
func goAppConfig(path string, port, instances int, ver, extra string) string {
	return fmt.Sprintf(`[apps.web]
command = [%q]
instances = %d
listen = ["tcp://127.0.0.1:%d"]
stop_timeout = "30s"
env = { GOAPP_VERSION = %q }
%s
`, path, instances, port, ver, extra)
}

// The app that is only worker.ServeHTTP loses nothing over reloads under
// both loads at once (keep-alive and a new connection per request).
func TestGoPackageAppReloadsDropNothing(t *testing.T) {
	parallelUnderLoad(t)
	path := goApp(t)
	port := FreePort(t)
	const instances, reloads = 2, 6
	a := StartAgent(t, bins, goAppConfig(path, port, instances, "v1", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	stop := startLoad(t, port, 50, 3*time.Minute)
	var durations []time.Duration
	for i := 1; i <= reloads; i++ {
		ver := fmt.Sprintf("v%d", i+1)
		r, took := reloadTo(a, "web", goAppConfig(path, port, instances, ver, ""))
		durations = append(durations, took.Round(time.Millisecond))
		if r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s", i, r.Code, r.Stderr)
		}
		for pid, v := range identities(t, port, PIDs(a.App("web"))) {
			if v != ver {
				t.Errorf("after reload %d, worker %d answers %s, want %s", i, pid, v, ver)
			}
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	t.Logf("reload durations (2 workers, default min_ready): %v", durations)
}
