package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// uvicorn alone and as gunicorn's worker class, with the app wrapped in
// integration/appservers/deployd_uvicorn.py's drain, lose nothing over
// reloads under both loads at once. (Without the drain uvicorn closes idle
// keep-alive connections and unread new ones at its stop: 5 to 50 failed
// requests per reload in the compat harness.)
func TestUvicornDrainReloadsDropNothing(t *testing.T) {
	requireTool(t, "apt-get install python3-gunicorn python3-uvicorn", debianPython, "-c", "import gunicorn, uvicorn.workers")
	for _, tc := range []struct {
		name, ready string
		argv        []string
	}{
		{"uvicorn", "log:Application startup complete", []string{debianPython, "-m", "uvicorn", "--fd", "3", "asgi_drain:app"}},
		{"gunicorn+UvicornWorker", "notify", []string{debianPython, "-m", "gunicorn", "--workers", "1", "--preload",
			"-k", "uvicorn.workers.UvicornWorker", "asgi_drain:app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const instances, reloads = 2, 3
			port := FreePort(t)
			app := func(ver string) string {
				return serverAppReady("web", tc.ready, port, instances, tc.argv, fmt.Sprintf("APP_VERSION = %q", ver), "")
			}
			a := StartAgent(t, bins, app("v1"))
			a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			stop := startLoad(t, port, 20, 3*time.Minute)
			var durations []time.Duration
			for i := 1; i <= reloads; i++ {
				ver := fmt.Sprintf("v%d", i+1)
				r, took := reloadTo(a, "web", app(ver))
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
			t.Logf("reload durations: %v", durations)
		})
	}
}
