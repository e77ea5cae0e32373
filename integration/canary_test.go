package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// lastJSON decodes the last line of a --json output into v.
func lastJSON(t *testing.T, r Result, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last --json line: %v\n%s", err, r.Stdout)
	}
}

// outcomeOf is the outcome of the one app of a streamed --json result.
func outcomeOf(t *testing.T, r Result) api.AppResult {
	t.Helper()
	var res api.Result
	lastJSON(t, r, &res)
	if len(res.Apps) != 1 {
		t.Fatalf("result of %d apps, want 1: %s", len(res.Apps), r.Stdout)
	}
	return res.Apps[0]
}

// versions are the versions each slot's worker answers with.
func versions(t *testing.T, a *Agent, port int) map[int]string {
	t.Helper()
	app := a.App("web")
	byPID := identities(t, port, PIDs(app))
	out := map[int]string{}
	for _, w := range app.Workers {
		out[w.Slot] = byPID[w.PID]
	}
	return out
}

func requireRefusedDuringHold(t *testing.T, a *Agent, args ...string) {
	t.Helper()
	r := a.CLI(args...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "holds a canary") ||
		!strings.Contains(r.Stderr, "deployd promote web") || !strings.Contains(r.Stderr, "deployd abort web") {
		t.Errorf("%v during the hold: exit %d, want 1 naming the hold and promote/abort:\n%s", args, r.Code, r.Stderr)
	}
}

// A canary held, promoted, and another aborted, under a keep-alive and a
// new-connection load at once: no request fails, both versions serve during
// the hold, and every other operation is refused meanwhile.
func TestCanaryHoldPromoteAbortUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	v1 := PIDs(appOf(st, "web"))
	stop := startLoad(t, port, 20, 3*time.Minute)

	a.WriteConfig(versionedApp(port, 2, "v2", "", ""))
	r := a.CLI("reload", "web", "--canary", "1", "--json")
	if res := outcomeOf(t, r); r.Code != 0 || res.Outcome != api.OutcomeHeld || res.Canary == nil ||
		fmt.Sprint(res.Canary.Slots) != "[0]" {
		t.Fatalf("reload --canary 1: exit %d, result %+v\n%s", r.Code, res, r.Stderr)
	}
	app := a.App("web")
	if app.State != "canary" || app.Canary == nil || app.Canary.HeldSeconds < 0 {
		t.Fatalf("status during the hold: state %q, canary %+v", app.State, app.Canary)
	}
	if got := versions(t, a, port); got[0] != "v2" || got[1] != "v1" {
		t.Fatalf("during the hold slots serve %v, want 0: v2, 1: v1", got)
	}
	if now := PIDs(app); now[1] != v1[1] {
		t.Errorf("the hold replaced slot 1: pid %d, then %d", v1[1], now[1])
	}
	if r := a.CLI("status", "web"); !strings.Contains(r.Stdout, "canary held") || !strings.Contains(r.Stdout, "deployd promote web") {
		t.Errorf("status text during the hold lacks the hold:\n%s", r.Stdout)
	}
	requireRefusedDuringHold(t, a, "reload", "web")
	requireRefusedDuringHold(t, a, "scale", "web", "3")
	requireRefusedDuringHold(t, a, "restart", "web")
	requireRefusedDuringHold(t, a, "upgrade")

	r = a.CLI("promote", "web", "--json")
	if res := outcomeOf(t, r); r.Code != 0 || res.Outcome != api.OutcomePromoted || res.CanaryEnd == nil || res.CanaryEnd.By != "promote" {
		t.Fatalf("promote: exit %d, result %+v\n%s", r.Code, res, r.Stderr)
	}
	if got := versions(t, a, port); got[0] != "v2" || got[1] != "v2" {
		t.Fatalf("after promote slots serve %v, want v2", got)
	}
	if st := a.App("web"); st.State != "running" || st.LastCanary == nil || st.LastCanary.Outcome != api.OutcomePromoted {
		t.Errorf("after promote: state %q, last canary %+v", st.State, st.LastCanary)
	}

	promoted := PIDs(a.App("web"))
	a.WriteConfig(versionedApp(port, 2, "v3", "", ""))
	if r := a.CLI("reload", "web", "--canary", "1"); r.Code != 0 || !strings.Contains(r.Stderr, "canary held") {
		t.Fatalf("second reload --canary 1: exit %d\n%s", r.Code, r.Stderr)
	}
	r = a.CLI("abort", "web", "--json")
	if res := outcomeOf(t, r); r.Code != 0 || res.Outcome != api.OutcomeAborted || res.CanaryEnd == nil || res.CanaryEnd.By != "abort" {
		t.Fatalf("abort: exit %d, result %+v\n%s", r.Code, res, r.Stderr)
	}
	if got := versions(t, a, port); got[0] != "v2" || got[1] != "v2" {
		t.Fatalf("after abort slots serve %v, want v2", got)
	}
	if now := PIDs(a.App("web")); now[1] != promoted[1] || now[0] == promoted[0] {
		t.Errorf("abort must replace the canary only: %v -> %v", promoted, now)
	}
	r = a.CLI("promote", "web")
	if r.Code != 1 || !strings.Contains(r.Stderr, "holds no canary") || !strings.Contains(r.Stderr, "aborted") {
		t.Errorf("promote after the abort: exit %d, want 1 saying the canary was aborted:\n%s", r.Code, r.Stderr)
	}
	if r := a.CLI("abort", "web"); r.Code != 0 {
		t.Errorf("abort after the abort: exit %d, want 0 (aborted already):\n%s", r.Code, r.Stderr)
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive through hold, promote and abort", ka)
	requireNoFailures(t, "new-connection through hold, promote and abort", nka)
	for _, res := range []loadgen.Result{ka, nka} {
		if res.Versions["v1"] == 0 || res.Versions["v2"] == 0 {
			t.Errorf("the load saw versions %v, want v1 and v2", res.Versions)
		}
	}
}

// canaryArtifact is a release folder whose ./run starts the test app at
// version with extra flags.
func canaryArtifact(t *testing.T, version, flags string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "release-"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	CopyFile(t, bins.TestApp, filepath.Join(dir, "server"))
	run := fmt.Sprintf("#!/bin/sh\nexec ./server -version %s %s\n", version, flags)
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte(run), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// deploy --canary returns once the hold starts (JSON status "held"); the
// release becomes current only when promoted. A canary that crashes during
// the hold aborts it by itself: its release is marked failed, the previous
// one serves everywhere, and promote says what happened.
func TestCanaryDeployCrashAbortsByItself(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 2))
	if r := a.CLI("deploy", "web", "--artifact", canaryArtifact(t, "1.0.0", ""), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("first deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	stop := startLoad(t, port, 20, 3*time.Minute)
	r := a.CLI("deploy", "web", "--artifact", canaryArtifact(t, "2.0.0", ""), "--version", "2.0.0", "--canary", "1", "--json")
	var dr api.DeployResult
	lastJSON(t, r, &dr)
	if r.Code != 0 || dr.Status != api.DeployHeld || dr.Canary == nil || dr.Canary.Release != "2.0.0" || dr.Canary.Previous != "1.0.0" {
		t.Fatalf("deploy --canary 1: exit %d, result %+v\n%s", r.Code, dr, r.Stderr)
	}
	if st := releaseStatus(t, a); st["1.0.0"] != "current" || st["2.0.0"] != "available" {
		t.Errorf("during the hold releases are %v, want 1.0.0 current, 2.0.0 available", st)
	}
	requireRefusedDuringHold(t, a, "deploy", "web", "--artifact", canaryArtifact(t, "9.0.0", ""), "--version", "9.0.0")
	if _, err := os.Stat(filepath.Join(a.Dir, "state", "releases", "web", "9.0.0")); err == nil {
		t.Error("a deploy refused during the hold installed its release")
	}
	if r := a.CLI("promote", "web"); r.Code != 0 || !strings.Contains(r.Stderr, "canary promoted") {
		t.Fatalf("promote: exit %d\n%s", r.Code, r.Stderr)
	}
	requireVersion(t, a, port, "2.0.0")
	if st := releaseStatus(t, a); st["2.0.0"] != "current" || st["1.0.0"] != "previous" {
		t.Errorf("after promote releases are %v", st)
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive through deploy --canary and promote", ka)
	requireNoFailures(t, "new-connection through deploy --canary and promote", nka)

	// 3.0.0 crashes 3 s after ready: past min_ready (1 s), inside the hold.
	stop = startLoad(t, port, 20, 3*time.Minute)
	before := PIDs(a.App("web"))
	r = a.CLI("deploy", "web", "--artifact", canaryArtifact(t, "3.0.0", "-crash-after 3s"), "--version", "3.0.0", "--canary", "1")
	if r.Code != 0 || !strings.Contains(r.Stderr, "canary held") {
		t.Fatalf("deploy --canary 1 of the crashing release: exit %d\n%s", r.Code, r.Stderr)
	}
	st := a.WaitFor("the crash to abort the hold", 30*time.Second, func(st *api.Status) bool {
		w := appOf(st, "web")
		return w.State == "running" && w.LastCanary != nil && AllReady(st, "web", 2)
	})
	ka, nka = stop()
	t.Logf("during the crashing canary: keep-alive %s; new-connection %s", ka, nka)
	if l := appOf(st, "web").LastCanary; l.Outcome != api.OutcomeAborted || l.By != "crash" || !strings.Contains(l.Reason, "crashed") {
		t.Fatalf("last canary %+v, want aborted by the crash", l)
	}
	requireVersion(t, a, port, "2.0.0")
	if now := PIDs(a.App("web")); now[1] != before[1] {
		t.Errorf("the abort touched slot 1: %v -> %v", before, now)
	}
	if st := releaseStatus(t, a); st["3.0.0"] != "failed" || st["2.0.0"] != "current" {
		t.Errorf("after the abort releases are %v, want 3.0.0 failed", st)
	}
	r = a.CLI("promote", "web")
	if r.Code != 1 || !strings.Contains(r.Stderr, "aborted") || !strings.Contains(r.Stderr, "crash") {
		t.Errorf("promote after the crash: exit %d, want 1 naming the crash:\n%s", r.Code, r.Stderr)
	}
	stop = startLoad(t, port, 20, 2*time.Second)
	time.Sleep(time.Second)
	ka, nka = stop()
	requireNoFailures(t, "keep-alive after the abort", ka)
	requireNoFailures(t, "new-connection after the abort", nka)
	for _, res := range []loadgen.Result{ka, nka} {
		if len(res.Versions) != 1 || res.Versions["2.0.0"] == 0 {
			t.Errorf("after the abort the load saw %v, want only 2.0.0", res.Versions)
		}
	}
}

// canary_timeout ends a hold by itself with canary_action; status shows it.
func TestCanaryTimeoutAction(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, port, 20, 2*time.Minute)
	for i, action := range []string{"promote", "abort"} {
		ver := fmt.Sprintf("v%d", i+2)
		a.WriteConfig(versionedApp(port, 2, ver, "", fmt.Sprintf("canary_timeout = \"3s\"\ncanary_action = %q\n", action)))
		if r := a.CLI("reload", "web", "--canary", "1"); r.Code != 0 || !strings.Contains(r.Stderr, "canary_timeout 3s: "+action) {
			t.Fatalf("reload --canary 1 with canary_timeout: exit %d\n%s", r.Code, r.Stderr)
		}
		if c := a.App("web").Canary; c == nil || c.TimeoutSeconds != 3 || c.Action != action {
			t.Fatalf("status during the hold: canary %+v", c)
		}
		st := a.WaitFor("canary_timeout", 30*time.Second, func(st *api.Status) bool {
			w := appOf(st, "web")
			return w.State == "running" && w.LastCanary != nil
		})
		l := appOf(st, "web").LastCanary
		outcome := map[string]string{"promote": api.OutcomePromoted, "abort": api.OutcomeAborted}[action]
		if l.Outcome != outcome || l.By != "canary_timeout" || l.HeldSeconds < 3 {
			t.Fatalf("%s: last canary %+v, want %s by canary_timeout after 3s", action, l, outcome)
		}
		want := ver
		if action == "abort" {
			want = "v2"
		}
		if got := versions(t, a, port); got[0] != want || got[1] != want {
			t.Errorf("after canary_timeout %s slots serve %v, want %s", action, got, want)
		}
		// Asking for what the timeout did already is not an error.
		if r := a.CLI(action, "web"); r.Code != 0 || !strings.Contains(r.Stderr, "canary_timeout") {
			t.Errorf("%s after the timeout did it: exit %d\n%s", action, r.Code, r.Stderr)
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive through canary_timeout", ka)
	requireNoFailures(t, "new-connection through canary_timeout", nka)
}

// A hold lives in the running agent only: after the agent is SIGKILLed
// during a deploy's hold, the next agent serves the release state.json
// names (the previous one) on every worker, and holds nothing.
func TestCanaryDeployHoldDiesWithTheAgent(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 2))
	if r := a.CLI("deploy", "web", "--artifact", canaryArtifact(t, "1.0.0", ""), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("first deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLI("deploy", "web", "--artifact", canaryArtifact(t, "2.0.0", ""), "--version", "2.0.0", "--canary", "1"); r.Code != 0 {
		t.Fatalf("deploy --canary 1: exit %d\n%s", r.Code, r.Stderr)
	}
	if got := versions(t, a, port); got[0] != "2.0.0" || got[1] != "1.0.0" {
		t.Fatalf("during the hold slots serve %v", got)
	}
	old := allWorkerPIDs(a.Status())
	if err := syscall.Kill(a.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.AwaitExit(t)
	a.Start()
	st := a.WaitFor("the next agent ready on one release", 30*time.Second, func(st *api.Status) bool {
		w := appOf(st, "web")
		return AllReady(st, "web", 2) && len(w.Workers) == 2 && w.Workers[0].Release == w.Workers[1].Release
	})
	// The killed agent's 1.0.0 worker is adopted; the canary (2.0.0) is
	// retired, replaced by a 1.0.0 worker.
	kept := allWorkerPIDs(st)
	for pid := range kept {
		delete(old, pid)
	}
	if len(old) == 0 {
		t.Errorf("the canary worker was adopted: workers %v", keys(kept))
	}
	waitAllGone(t, old, 15*time.Second)
	requireVersion(t, a, port, "1.0.0")
	if app := a.App("web"); app.State != "running" || app.Canary != nil {
		t.Errorf("after the agent restart: state %q, canary %+v", app.State, app.Canary)
	}
	if st := releaseStatus(t, a); st["1.0.0"] != "current" {
		t.Errorf("after the agent restart releases are %v", st)
	}
}
