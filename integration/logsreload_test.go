package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// A reload that changes [apps.web.logs] applies it: the new workers' lines
// are written in the new format. Before, the reload said done and the log
// files kept the settings of the agent's start.
func TestReloadAppliesLogSettings(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	app := func(logs string) string {
		return fmt.Sprintf(`[apps.web]
command = ["/bin/sh", "-c", "echo started $$; exec %%TESTAPP%%"]
instances = 1
listen = ["tcp://127.0.0.1:%d"]
ready_timeout = "10s"
stop_timeout = "10s"
%s`, port, logs)
	}
	a := StartAgent(t, bins, app(""))
	waitStatus(t, a, "web ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	a.WriteConfig(app("[apps.web.logs]\nformat = \"json\"\n"))
	r := cliAsBounded(t, a, nil, 60*time.Second, "reload", "web")
	if r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	if !strings.Contains(r.Stderr+r.Stdout, "new [logs] settings applied") {
		t.Errorf("the reload does not say the log settings were applied:\n%s%s", r.Stdout, r.Stderr)
	}
	pid := appOf(waitStatus(t, a, "web ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) }), "web").Workers[0].PID
	want := fmt.Sprintf("started %d", pid)
	var line string
	for deadline := time.Now().Add(10 * time.Second); line == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, want) {
				line = l
			}
		}
	}
	if line == "" {
		t.Fatalf("web.out.log has no %q within 10 s", want)
	}
	if !strings.HasPrefix(line, "{") {
		t.Errorf("the new worker's line is not json after the reload: %q", line)
	}
}
