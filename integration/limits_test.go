package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// A worker over memory_max is killed by the kernel's OOM killer, not by a
// poll of its RSS: the agent says so with the app's last lines, and the
// slot restarts.
func TestMemoryMaxOOMKillReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroup limits need a root agent here")
	}
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 1, "memory_max = \"64MiB\"\n"))
	st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	old := PIDs(appOf(st, "web"))[0]
	if strings.Contains(a.Log(), "memory_max cannot apply") {
		t.Skipf("memory_max cannot apply on this host: %s", a.Log())
	}
	_, _ = get(t, port, "/alloc?mb=128") // the worker dies answering it
	line := waitLogLine(t, a, "the OOM kill", "the kernel's OOM killer killed the worker at memory_max", "worker=0", "last_lines=")
	if strings.Contains(line, `last_lines=""`) {
		t.Errorf("no last lines: %s", line)
	}
	waitLogLine(t, a, "the restart", "worker exited, restarting", "OOM killer")
	a.WaitFor("the slot restarted", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 1) && PIDs(appOf(st, "web"))[0] != old
	})
}
