package integration

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// uvicorn alone and as gunicorn's worker class, with the app wrapped in
// integration/appservers/deployd_uvicorn.py's drain, lose nothing over
// reloads under both loads at once. (Without the drain uvicorn closes idle
// keep-alive connections and unread new ones at its stop: 5 to 50 failed
// requests per reload in the compat harness.) Connections that never send a
// request do not hold the drain up: every old worker exits 0 on its own.
func TestUvicornDrainReloadsDropNothing(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
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
			const instances, reloads = 2, 2
			port := FreePort(t)
			app := func(ver string) string {
				return serverAppReady("web", tc.ready, port, instances, tc.argv, fmt.Sprintf("APP_VERSION = %q", ver), "")
			}
			a := StartAgent(t, bins, app("v1"))
			a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			silent := silentConns(t, port, 4)
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
			for _, c := range silent {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := c.Read(make([]byte, 1)); n > 0 || isTimeout(err) {
					t.Errorf("a connection that sent nothing is still open after every worker was replaced (read %d, %v)", n, err)
				}
			}
			// The last old workers may still drain (in the background) when
			// the reload returns.
			a.WaitFor("the old workers to drain", 30*time.Second, func(st *api.Status) bool {
				return len(appOf(st, "web").Draining) == 0
			})
			// The agent's log reaches the test through a pipe, after the
			// status: its exited lines may come a moment after Draining
			// emptied (3 of 4 once, among parallel tests).
			var exits [][]string
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				exits = exitedEvent.FindAllStringSubmatch(a.Log(), -1)
				if len(exits) >= instances*reloads || time.Now().After(deadline) {
					break
				}
			}
			if len(exits) != instances*reloads {
				t.Errorf("%d old workers exited, want %d", len(exits), instances*reloads)
			}
			for _, m := range exits {
				if m[1] != "exit status 0" {
					t.Errorf("an old worker ended with %q, want exit status 0 (a drain that ends on its own)", m[1])
				}
			}
		})
	}
}

// exitedEvent is the agent's debug line for a stopped worker that is gone;
// it captures how the worker ended, before any "; last status".
var exitedEvent = regexp.MustCompile(`event=exited worker=\d+ pid=\d+ release=\S+ ms=\d+ message="([^";]*)`)

// silentConns opens n connections to port that never send anything.
func silentConns(t *testing.T, port, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for range n {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
