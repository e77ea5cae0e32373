package integration

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// Servers whose own shutdown closes what they accepted but have not read
// (uvicorn, Go's http.Server.Shutdown), each in a steered pool (a socket of
// its own per worker), lose no new-connection request over 5 reloads under
// a keep-alive and a new-connection load at once: the quiet phase holds each
// old worker's stop signal until its accept queue and its unread
// connections run dry. The keep-alive requests the servers' own close of
// idle connections costs are counted, not hidden (docs/compatibility.md).
//
// DEPLOYD_TEST_QUIET=off runs the same with quiet_timeout = "0s" (the
// drain as it was), to show what the phase saves: the test then fails.
func TestQuietStopDropsNoNewConnection(t *testing.T) {
	needSteering(t)
	off := os.Getenv("DEPLOYD_TEST_QUIET") == "off"
	for _, tc := range []struct {
		name string
		argv func(t *testing.T) ([]string, string, string) // command, ready, env
	}{
		{"uvicorn", func(t *testing.T) ([]string, string, string) {
			requireTool(t, "apt-get install python3-uvicorn", debianPython, "-c", "import uvicorn")
			return []string{debianPython, "-m", "uvicorn", "--fd", "3", "asgi:app"},
				"log:Application startup complete", "APP_VERSION = %q"
		}},
		{"go-shutdown", func(t *testing.T) ([]string, string, string) {
			return []string{goShutdownApp(t)}, "log:serving", "GOAPP_VERSION = %q"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parallelUnderLoad(t)
			argv, ready, env := tc.argv(t)
			const instances, reloads = 2, 5
			port := FreePort(t)
			extra := `balance = "even"`
			if off {
				extra += "\nquiet_timeout = \"0s\""
			}
			app := func(ver string) string {
				return serverAppReady("web", ready, port, instances, argv, fmt.Sprintf(env, ver), extra)
			}
			a := StartAgent(t, bins, app("v1"))
			a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			stop := startLoad(t, port, 20, 3*time.Minute)
			for i := 1; i <= reloads; i++ {
				if r, _ := reloadTo(a, "web", app(fmt.Sprintf("v%d", i+1))); r.Code != 0 {
					t.Fatalf("reload %d: exit %d\n%s", i, r.Code, r.Stderr)
				}
			}
			a.WaitFor("the old workers to drain", 60*time.Second, func(st *api.Status) bool {
				return len(appOf(st, "web").Draining) == 0
			})
			ka, nka := stop()
			t.Logf("quiet phase %s; keep-alive clients: %s", map[bool]string{true: "off", false: "on"}[off], ka)
			t.Logf("keep-alive failures (the server's own close of idle kept-alive connections): %d; errors %v",
				ka.Failures, ka.Errors)
			requireNoFailures(t, "new-connection clients", nka)
			if !off {
				qs := quietPhases(a.Log())
				if len(qs) != instances*reloads {
					t.Errorf("%d quiet phases in the agent log, want %d", len(qs), instances*reloads)
				}
				ds := make([]time.Duration, len(qs))
				for i, q := range qs {
					ds[i] = q.waited
				}
				t.Logf("quiet phases: %v; added per worker: median %v, p99 %v", qs, percentile(ds, 50), percentile(ds, 99))
			}
		})
	}
}

// quietPhase is one "quiet before the stop signal" line of the agent log.
type quietPhase struct {
	outcome string
	waited  time.Duration
	idle    int
}

func (q quietPhase) String() string { return fmt.Sprintf("%s/%v/idle=%d", q.outcome, q.waited, q.idle) }

var quietLine = regexp.MustCompile(`outcome=(\w+) waited_ms=(\d+) idle_kept_alive=(\d+)`)

// quietPhases reads the quiet phases from the agent's log.
func quietPhases(log string) []quietPhase {
	var out []quietPhase
	for _, m := range quietLine.FindAllStringSubmatch(log, -1) {
		ms, _ := strconv.Atoi(m[2])
		idle, _ := strconv.Atoi(m[3])
		out = append(out, quietPhase{outcome: m[1], waited: time.Duration(ms) * time.Millisecond, idle: idle})
	}
	return out
}

// percentile is the p-th percentile (0..100) of ds, sorted in place.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

var (
	goShutdownOnce sync.Once
	goShutdownPath string
	goShutdownErr  error
)

// goShutdownApp builds integration/goshutdown once.
func goShutdownApp(t *testing.T) string {
	t.Helper()
	goShutdownOnce.Do(func() {
		goShutdownPath, goShutdownErr = Build(bins.Dir, "goshutdown", "./integration/goshutdown", "")
	})
	if goShutdownErr != nil {
		t.Fatal(goShutdownErr)
	}
	return goShutdownPath
}
