package integration

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestReloadAddsAndRemovesApps adds an app to the config and reloads (all
// apps, then by name), then removes it and reloads, while the app that
// stays is under both loads. A reload that adds an app once deadlocked the
// agent (a lock taken twice): the harness's deadline on every call turns a
// hang into a failure with the agent's goroutines in the log.
func TestReloadAddsAndRemovesApps(t *testing.T) {
	parallelUnderLoad(t)
	webPort, apiPort, jobsPort := FreePort(t), FreePort(t), FreePort(t)
	web := versionedApp(webPort, 2, "v1", "", "")
	a := StartAgent(t, bins, web)
	a.CallTimeout = time.Minute
	a.WaitFor("web ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, webPort, 32, 2*time.Minute)

	// A full reload that adds an app.
	a.WriteConfig(web + appConfig("api", apiPort, 2, ""))
	if r := a.CLI("reload"); r.Code != 0 {
		t.Fatalf("reload that adds api: exit %d\n%s", r.Code, r.Stderr)
	}
	st := a.WaitFor("api ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "api", 2) })
	identities(t, apiPort, PIDs(appOf(st, "api")))

	// A named reload that adds another.
	a.WriteConfig(web + appConfig("api", apiPort, 2, "") + appConfig("jobs", jobsPort, 1, ""))
	if r := a.CLI("reload", "jobs"); r.Code != 0 {
		t.Fatalf("reload jobs (new): exit %d\n%s", r.Code, r.Stderr)
	}
	st = a.WaitFor("jobs ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "jobs", 1) })
	identities(t, jobsPort, PIDs(appOf(st, "jobs")))
	apiPIDs := PIDs(appOf(st, "api"))

	// A full reload that removes both.
	a.WriteConfig(web)
	if r := a.CLI("reload"); r.Code != 0 {
		t.Fatalf("reload that removes api and jobs: exit %d\n%s", r.Code, r.Stderr)
	}
	st = a.Status()
	for _, gone := range []string{"api", "jobs"} {
		for _, ap := range st.Apps {
			if ap.Name == gone {
				t.Errorf("%s still in status after its removal: %+v", gone, ap)
			}
		}
	}
	for _, pid := range apiPIDs {
		if Alive(pid) {
			t.Errorf("api worker %d still runs after the app was removed", pid)
		}
	}
	for _, port := range []int{apiPort, jobsPort} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still accepts after its app was removed", port)
		}
	}
	if !AllReady(st, "web", 2) {
		t.Errorf("web after the removals: %+v", appOf(st, "web"))
	}
	ka, nka := stop()
	requireNoFailures(t, "web keep-alive", ka)
	requireNoFailures(t, "web new-connection", nka)
}
