package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// waitLogLine waits until one line of the agent's log contains every part.
func waitLogLine(t *testing.T, a *Agent, what string, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, l := range strings.Split(a.Log(), "\n") {
			if containsAll(l, parts) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent log has no line for %s (with %q):\n%s", what, parts, a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// The agent's own log records every operation: who asked, each slot's
// steps at debug level, the outcome and its duration, abandoned and
// refused ones included.
func TestAgentLogRecordsOperations(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	uid := fmt.Sprintf("uid=%d", os.Getuid())

	a.WriteConfig(versionedApp(port, 2, "v2", "", ""))
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	done := waitLogLine(t, a, "the reload's outcome", "[INFO]", "operation done: op=reload", uid, "app=web", "outcome=done", "duration=")
	for slot := range 2 {
		waitLogLine(t, a, fmt.Sprintf("slot %d's ready step", slot),
			"[DEBUG]", "operation step: op=reload", uid, "app=web", "event=ready", fmt.Sprintf("worker=%d", slot))
	}

	a.WriteConfig(versionedApp(port, 2, "v3", `TESTAPP_EXIT_BEFORE_READY = "4"`, ""))
	if r := a.CLI("reload", "web"); r.Code != 1 {
		t.Fatalf("reload of a version that exits: exit %d, want 1\n%s", r.Code, r.Stderr)
	}
	abandoned := waitLogLine(t, a, "the abandoned reload", "[WARN]", "operation not done: op=reload", uid, "app=web",
		"outcome=abandoned", "duration=", "exit status 4")

	if r := a.CLI("scale", "nosuch", "3"); r.Code == 0 {
		t.Fatalf("scale of an unknown app: exit 0")
	}
	refused := waitLogLine(t, a, "the refused scale", "[WARN]", "operation refused: op=scale", uid, "status=404", `unknown app`)
	t.Logf("agent log:\n%s\n%s\n%s", done, abandoned, refused)
}
