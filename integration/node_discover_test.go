package integration

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/integration/loadgen"
)

// The tutorials' cluster app with no listen list in its config: the agent
// learns the port from the app's own listen(port), binds it and hands it to
// every worker. It serves, reloads 5 times and upgrades the agent with 0
// failed requests; the discovery run never serves (its listening callback
// never runs: the app's log has one line per worker start, no more).
func TestNodeClusterAppWithoutListen(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	// The one change from the tutorial: loopback only, as every test here.
	js := strings.Replace(clusterApp, "app.listen(port, () =>", "app.listen(port, '127.0.0.1', () =>", 1)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": js})
	listen := fmt.Sprintf("listen = [\"tcp://127.0.0.1:%d\"]\n", port)
	cfg := nodeConfig(dir, []string{"node", "app.js"}, port, 2, "")
	if !strings.Contains(cfg, listen) {
		t.Fatalf("nodeConfig changed: no %q in\n%s", listen, cfg)
	}
	cfg = strings.Replace(cfg, listen, "", 1)
	load := func() func() (loadgen.Result, loadgen.Result) {
		return formLoad(t, loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/", port)}, 20, 20)
	}
	a := reloadNodeUnder(t, cfg, port, 2, 5, load)

	want := fmt.Sprintf("tcp://127.0.0.1:%d (discovered)", port)
	if got := appOf(a.Status(), "web").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("status listen = %q, want [%q]", got, want)
	}
	if r := a.CLIWithin(time.Minute, "config", "check"); r.Code != 0 || !strings.Contains(r.Stdout, "listen discovered at its first bind") {
		t.Errorf("config check: exit %d, want the listen said to be discovered\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	// An agent upgrade takes the discovered listener over with the workers.
	before := PIDs(appOf(a.Status(), "web"))
	stop := load()
	if r := a.CLIWithin(2*time.Minute, "upgrade"); r.Code != 0 {
		t.Fatalf("upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients over the upgrade", ka)
	requireNoFailures(t, "new-connection clients over the upgrade", nka)
	st := a.Status()
	if after := PIDs(appOf(st, "web")); !maps.Equal(before, after) {
		t.Errorf("the upgrade changed the workers: before %v, after %v", before, after)
	}
	if got := appOf(st, "web").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("after the upgrade, status listen = %q, want [%q]", got, want)
	}
}

// What a PM2 user types, from a config with an [agent] table only: no
// port anywhere but in the app. The table written has no listen; the
// agent serves the port the app asked for.
func TestPM2StartWithoutPort(t *testing.T) {
	parallel(t) // see parallel.go
	port := FreePort(t)
	js := strings.Replace(pm2App, "app.listen(port, () =>", "app.listen(port, '127.0.0.1', () =>", 1)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": js})
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()
	mustRun(t, a.CLIIn(dir, "start", "app.js", "-i", "2"), "deployd start app.js -i 2")
	if st := a.Status(); !AllReady(st, "app", 2) {
		t.Fatalf("after deployd start: want 2 ready workers of app, got %+v", st.Apps)
	}
	if body, err := get(t, port, "/"); err != nil || body != "Hello World! - -" {
		t.Fatalf("GET /: %q, %v", body, err)
	}
	b, _ := os.ReadFile(a.Config)
	if strings.Contains(string(b), "listen    =") || !strings.Contains(string(b), "# no listen") {
		t.Errorf("the table written has a listen line, or does not say why not:\n%s", b)
	}
	want := fmt.Sprintf("tcp://127.0.0.1:%d (discovered)", port)
	if got := a.App("app").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("status listen = %q, want [%q]", got, want)
	}
}
