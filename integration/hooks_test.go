package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// hooksApp is releasesApp with hooks: ./before (a shell string) and
// ./after (an argv), each in the release.
func hooksApp(port, instances int, extra string) string {
	return releasesApp(port, instances) + `# user
[apps.web.hooks]
before = "./before"
after = ["./after"]
before_timeout = "3s"
after_timeout = "5s"
` + extra
}

// hookRelease makes a release folder whose ./run serves the version its
// before hook wrote into ./built (so a worker shows it saw the hook's file),
// with the given before and after scripts (shell bodies).
func hookRelease(t *testing.T, version, before, after string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "release-"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	CopyFile(t, bins.TestApp, filepath.Join(dir, "server"))
	for name, body := range map[string]string{
		"run":    "exec ./server -version \"$(cat built)\"",
		"before": before,
		"after":  after,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// goodBefore writes ./built and says where it ran and for what.
const goodBefore = `echo "migrating $DEPLOYD_RELEASE from ${DEPLOYD_PREVIOUS_RELEASE:-none} ($DEPLOYD_OPERATION) in $(pwd) as uid $(id -u)"
echo "$DEPLOYD_RELEASE-built-$(id -u)" > built`

// lastResult decodes the last line of a --json deploy or rollback.
func lastResult(t *testing.T, r Result) api.DeployResult {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	var res api.DeployResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last --json line: %v\n%s", err, r.Stdout)
	}
	return res
}

// requireServing checks that web runs release rel and every worker answers
// with version served.
func requireServing(t *testing.T, a *Agent, port int, rel, served string) {
	t.Helper()
	app := a.App("web")
	if app.Release != rel {
		t.Errorf("app release %q, want %q", app.Release, rel)
	}
	for pid, v := range identities(t, port, PIDs(app)) {
		if v != served {
			t.Errorf("worker %d serves %s, want %s", pid, v, served)
		}
	}
}

func TestDeployHooks(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, hooksApp(port, 2, ""))
	uid := strconv.Itoa(os.Getuid())
	built := func(v string) string { return v + "-built-" + uid }

	// A good release: before runs in the new release's folder, the workers
	// serve what it wrote there, after runs once it serves.
	r := a.CLI("deploy", "web", "--artifact", hookRelease(t, "1.0.0", goodBefore, `echo "after $DEPLOYD_RELEASE"`), "--version", "1.0.0", "--json")
	if r.Code != 0 {
		t.Fatalf("deploy 1.0.0: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	res := lastResult(t, r)
	if res.Status != api.DeployDeployed || len(res.Hooks) != 2 || !res.Hooks[0].OK || !res.Hooks[1].OK ||
		res.Hooks[0].Hook != "before" || res.Hooks[1].Hook != "after" {
		t.Errorf("deploy 1.0.0 result: %+v", res)
	}
	relDir := filepath.Join(a.Dir, "state", "releases", "web", "1.0.0")
	if want := "in " + relDir + " "; !slices.ContainsFunc(res.Hooks[0].LastLines, func(l string) bool { return strings.Contains(l, want) }) {
		t.Errorf("before hook did not run in the release folder %s: %q", relDir, res.Hooks[0].LastLines)
	}
	requireServing(t, a, port, "1.0.0", built("1.0.0"))
	before := PIDs(a.App("web"))

	// A failing before hook under both loads: exit 1, its output shown,
	// no worker touched, the release not installed, every request answered
	// by the previous release.
	stop := startLoad(t, port, 20, time.Minute)
	bad := hookRelease(t, "2.0.0", `echo "migration 7 of $DEPLOYD_RELEASE"; echo "migration 7 failed: column exists" >&2; exit 4`, "echo never")
	r = a.CLI("deploy", "web", "--artifact", bad, "--version", "2.0.0")
	rj := a.CLI("deploy", "web", "--artifact", bad, "--version", "2.0.0", "--json")
	// A before hook past before_timeout is stopped, with the processes it started.
	pidFile := filepath.Join(t.TempDir(), "sleeper.pid")
	slow := hookRelease(t, "2.1.0", fmt.Sprintf("sleep 60 & echo $! > %s; wait", pidFile), "echo never")
	t0 := time.Now()
	rs := a.CLI("deploy", "web", "--artifact", slow, "--version", "2.1.0")
	ka, nka := stop()
	if rs.Code != 1 || !strings.Contains(rs.Stderr, "before hook timed out after 3s (before_timeout)") {
		t.Errorf("slow before hook: exit %d after %s\n%s", rs.Code, time.Since(t0), rs.Stderr)
	}
	if b, err := os.ReadFile(pidFile); err != nil {
		t.Errorf("the slow hook's child pid: %v", err)
	} else if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid == 0 || Alive(pid) {
		t.Errorf("the slow hook's child %q is still running", b)
	}
	if r.Code != 1 || rj.Code != 1 {
		t.Fatalf("deploy with a failing before hook: exit %d and %d (--json), want 1\n%s\n%s", r.Code, rj.Code, r.Stderr, rj.Stdout)
	}
	for _, want := range []string{"REFUSED", "before hook failed: exit status 4", "nothing changed", "1.0.0 keeps serving",
		"| hook before: migration 7 of 2.0.0", "| hook before: migration 7 failed: column exists"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("refused deploy output lacks %q:\n%s", want, r.Stderr)
		}
	}
	res = lastResult(t, rj)
	if res.Status != api.DeployRefused || res.ExitStatus != "exit status 4" || len(res.Hooks) != 1 || res.Hooks[0].OK ||
		!slices.Contains(res.LastLines, "hook before: migration 7 failed: column exists") {
		t.Errorf("refused deploy --json result: %+v", res)
	}
	if strings.Contains(rj.Stdout, `"type":"started"`) {
		t.Errorf("a refused deploy started a worker:\n%s", rj.Stdout)
	}
	requireNoFailures(t, "keep-alive during the refused deploy", ka)
	requireNoFailures(t, "new-connection during the refused deploy", nka)
	for _, l := range []loadgen.Result{ka, nka} {
		if len(l.Versions) != 1 || l.Versions[built("1.0.0")] == 0 {
			t.Errorf("during the refused deploy the load saw versions %v, want only %s", l.Versions, built("1.0.0"))
		}
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused deploy changed the workers: %v -> %v", before, after)
	}
	if st := releaseStatus(t, a); len(st) != 1 || st["1.0.0"] != "current" {
		t.Errorf("after the refused deploy, releases %v, want only 1.0.0 current", st)
	}

	// A failing after hook is reported; the release serves.
	r = a.CLI("deploy", "web", "--artifact", hookRelease(t, "3.0.0", goodBefore, `echo "cache purge failed" >&2; exit 2`), "--version", "3.0.0", "--json")
	res = lastResult(t, r)
	if r.Code != 0 || res.Status != api.DeployDeployed || len(res.Hooks) != 2 || res.Hooks[1].OK ||
		res.Hooks[1].ExitStatus != "exit status 2" || !slices.Contains(res.Hooks[1].LastLines, "hook after: cache purge failed") {
		t.Errorf("deploy with a failing after hook: exit %d, result %+v", r.Code, res)
	}
	requireServing(t, a, port, "3.0.0", built("3.0.0"))
	r = a.CLI("deploy", "web", "--artifact", hookRelease(t, "3.1.0", goodBefore, `echo "cache purge failed" >&2; exit 2`), "--version", "3.1.0")
	if r.Code != 0 || !strings.Contains(r.Stderr, "WARNING: after hook failed: exit status 2") || !strings.Contains(r.Stderr, "| hook after: cache purge failed") {
		t.Errorf("failing after hook, text output: exit %d\n%s", r.Code, r.Stderr)
	}

	// Rollback runs the hooks of the release it goes to.
	r = a.CLI("rollback", "web", "--json")
	res = lastResult(t, r)
	if r.Code != 0 || res.Status != api.DeployRolledBack || len(res.Hooks) != 2 ||
		!slices.ContainsFunc(res.Hooks[0].LastLines, func(l string) bool { return strings.Contains(l, "migrating 3.0.0 from 3.1.0 (rollback)") }) {
		t.Errorf("rollback: exit %d, result %+v", r.Code, res)
	}
	requireServing(t, a, port, "3.0.0", built("3.0.0"))

	// Every hook's output is in the app's log, stdout and stderr apart.
	if r := a.CLI("logs", "web", "--lines", "1000"); r.Code != 0 {
		t.Fatalf("logs: exit %d: %s", r.Code, r.Stderr)
	}
	out, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	errs, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.err.log"))
	for _, want := range []string{"hook before: migrating 1.0.0 from none (deploy)", "hook after: after 1.0.0",
		"hook before: migration 7 of 2.0.0", "hook before: migrating 3.0.0 from 3.1.0 (rollback)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("web.out.log lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"[web -1 ", "hook before: migration 7 failed: column exists", "hook after: cache purge failed"} {
		if !strings.Contains(string(errs), want) {
			t.Errorf("web.err.log lacks %q:\n%s", want, errs)
		}
	}
}

// Hooks run as the app's user, who can write in the new release folder.
func TestDeployHooksRunAsAppUser(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	a := StartAgent(t, bins, strings.Replace(hooksApp(port, 1, ""), "# user", fmt.Sprintf("user = %q", m.Name), 1))
	r := a.CLI("deploy", "web", "--artifact", hookRelease(t, "1.0.0", goodBefore, `echo "after as $(id -u)"`), "--version", "1.0.0", "--json")
	if r.Code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	requireServing(t, a, port, "1.0.0", fmt.Sprintf("1.0.0-built-%d", m.UID))
	res := lastResult(t, r)
	if len(res.Hooks) != 2 || !slices.Contains(res.Hooks[1].LastLines, fmt.Sprintf("hook after: after as %d", m.UID)) {
		t.Errorf("after hook's user: %+v", res.Hooks)
	}
}

// deploy --canary runs the before hook ahead of the canaries and the after
// hook only once the canary is promoted (the release then serves on every
// worker), not at the hold.
func TestCanaryDeployRunsAfterHookAtPromote(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, hooksApp(port, 2, ""))
	if r := a.CLI("deploy", "web", "--artifact", hookRelease(t, "1.0.0", goodBefore, "true"), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("deploy 1.0.0: exit %d\n%s", r.Code, r.Stderr)
	}
	// A --canary the app cannot hold is refused before the install and
	// the before hook: nothing changed.
	ran := filepath.Join(t.TempDir(), "before-ran")
	r := a.CLI("deploy", "web", "--artifact", hookRelease(t, "1.5.0", "touch "+ran, "true"), "--version", "1.5.0", "--canary", "2")
	if r.Code != 2 || !strings.Contains(r.Stderr, "nothing changed") {
		t.Errorf("deploy --canary 2 of a 2-worker app: exit %d, want 2 and nothing changed\n%s", r.Code, r.Stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the before hook ran for a refused --canary")
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "state", "releases", "web", "1.5.0")); err == nil {
		t.Error("a deploy with a refused --canary installed its release")
	}
	marker := filepath.Join(t.TempDir(), "after-ran")
	after := fmt.Sprintf(`echo "$DEPLOYD_RELEASE after $DEPLOYD_PREVIOUS_RELEASE" > %s`, marker)
	r = a.CLI("deploy", "web", "--artifact", hookRelease(t, "2.0.0", goodBefore, after), "--version", "2.0.0", "--canary", "1", "--json")
	if res := lastResult(t, r); r.Code != 0 || res.Status != api.DeployHeld || len(res.Hooks) != 1 || res.Hooks[0].Hook != "before" {
		t.Fatalf("deploy --canary 1: exit %d, result %+v, want held after the before hook alone\n%s", r.Code, res, r.Stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the after hook ran at the hold, before the promote")
	}
	// The promote runs the after hook and reports it, as a deploy does.
	r = a.CLI("promote", "web", "--json")
	res := outcomeOf(t, r)
	if r.Code != 0 || res.Outcome != api.OutcomePromoted || len(res.Hooks) != 1 || res.Hooks[0].Hook != "after" || !res.Hooks[0].OK {
		t.Fatalf("promote: exit %d, result %+v, want promoted with the after hook OK\n%s", r.Code, res, r.Stderr)
	}
	if b, err := os.ReadFile(marker); err != nil || strings.TrimSpace(string(b)) != "2.0.0 after 1.0.0" {
		t.Errorf("when promote returned, the after hook had written %q (%v), want \"2.0.0 after 1.0.0\"", b, err)
	}
	// The log comes through a pipe, after the answer (missing once among
	// parallel tests on a loaded machine).
	waitLogLine(t, a, "the end of the after hook", "hook done", "hook=after version=2.0.0")
	// A failing one is a warning: the release serves.
	r = a.CLI("deploy", "web", "--artifact", hookRelease(t, "3.0.0", goodBefore, "echo no cache to warm; exit 4"), "--version", "3.0.0", "--canary", "1")
	if r.Code != 0 {
		t.Fatalf("deploy 3.0.0 --canary 1: exit %d\n%s", r.Code, r.Stderr)
	}
	r = a.CLI("promote", "web")
	if r.Code != 0 || !strings.Contains(r.Stderr, "WARNING: after hook failed: exit status 4; the release serves") ||
		!strings.Contains(r.Stderr, "| hook after: no cache to warm") {
		t.Errorf("promote with a failing after hook: exit %d, want 0 and a warning with its output\n%s", r.Code, r.Stderr)
	}
	requireServing(t, a, port, "3.0.0", fmt.Sprintf("3.0.0-built-%d", os.Getuid()))
}

// The after hook of a canary that canary_timeout promotes runs in the
// agent, tracked: an upgrade that starts while it runs waits for its end,
// and so does a shutdown; the agent log has each end.
func TestPromotedCanaryAfterHookIsWaitedFor(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	cfg := strings.Replace(hooksApp(port, 2, ""), "# user", "canary_timeout = \"1s\"\ncanary_action = \"promote\"", 1)
	a := StartAgent(t, bins, cfg)
	if r := a.CLI("deploy", "web", "--artifact", hookRelease(t, "1.0.0", goodBefore, "true"), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("deploy 1.0.0: exit %d\n%s", r.Code, r.Stderr)
	}
	for i, step := range []string{"upgrade", "shutdown"} {
		ver := fmt.Sprintf("%d.0.0", i+2)
		dir := t.TempDir()
		started, ended := filepath.Join(dir, "started"), filepath.Join(dir, "ended")
		after := fmt.Sprintf("touch %s; sleep 3; echo \"$DEPLOYD_RELEASE\" > %s", started, ended)
		if r := a.CLI("deploy", "web", "--artifact", hookRelease(t, ver, goodBefore, after), "--version", ver, "--canary", "1"); r.Code != 0 {
			t.Fatalf("deploy %s --canary 1: exit %d\n%s", ver, r.Code, r.Stderr)
		}
		a.WaitFor("the after hook started by canary_timeout's promote", 20*time.Second, func(*api.Status) bool {
			_, err := os.Stat(started)
			return err == nil
		})
		// Meanwhile promote tells how the hold ended, not that the app is busy.
		if r := a.CLI("promote", "web"); r.Code != 0 || !strings.Contains(r.Stderr, "promoted already") || !strings.Contains(r.Stderr, "canary_timeout") {
			t.Errorf("promote while the after hook runs: exit %d, want 0 and promoted already by canary_timeout\n%s", r.Code, r.Stderr)
		}
		ctx, cancel := a.Ctx(0)
		v, err := a.Client.Version(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if r := a.CLI(step); r.Code != 0 {
			t.Fatalf("%s: exit %d\n%s", step, r.Code, r.Stderr)
		}
		if step == "shutdown" {
			for Alive(v.PID) && time.Since(t0) < 30*time.Second {
				time.Sleep(20 * time.Millisecond)
			}
		}
		// By the time the upgrade returned, or the agent exited, the hook had ended.
		if b, err := os.ReadFile(ended); err != nil || strings.TrimSpace(string(b)) != ver {
			t.Errorf("%s returned after %s, but the after hook had not ended (wrote %q, %v)",
				step, time.Since(t0).Round(time.Millisecond), b, err)
		}
		if log := a.Log(); !regexp.MustCompile(`hook done.* hook=after version=` + regexp.QuoteMeta(ver)).MatchString(log) {
			t.Errorf("%s: the agent log has no end of the after hook of %s:\n%s", step, ver, log)
		}
	}
}

// A before hook that starts a daemon (setsid, so it leaves the hook's
// session) is refused at once, with or without the daemon's stdio: the
// refusal names the process, and the daemon is gone when the deploy
// returns. Nothing changed: the previous release serves.
func TestHookDaemonIsKilledAndNamed(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, hooksApp(port, 1, ""))
	if r := a.CLIWithin(60*time.Second, "deploy", "web", "--artifact", hookRelease(t, "1.0.0", goodBefore, "true"), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("deploy 1.0.0: exit %d\n%s", r.Code, r.Stderr)
	}
	for i, daemon := range []string{
		"setsid sleep 1000 &",                            // keeps the hook's stdout and stderr
		"setsid sleep 1001 </dev/null >/dev/null 2>&1 &", // closed stdio: nothing holds the hook up
	} {
		ver := fmt.Sprintf("2.0.%d", i)
		pidFile := filepath.Join(t.TempDir(), "daemon.pid")
		before := goodBefore + "\n" + daemon + "\necho $! > " + pidFile + "\necho started the daemon"
		t0 := time.Now()
		r := a.CLIWithin(60*time.Second, "deploy", "web", "--artifact", hookRelease(t, ver, before, "true"), "--version", ver, "--json")
		took := time.Since(t0)
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatalf("%s: the hook wrote no pid: %v\n%s%s", daemon, err, r.Stdout, r.Stderr)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		res := lastResult(t, r)
		// The name is read when the hook ends: the shell's child may not
		// have exec'd setsid, nor setsid sleep, yet; the pid is what counts.
		name := regexp.MustCompile(fmt.Sprintf(`pid %d \(`, pid))
		if r.Code == 0 || res.Status != api.DeployRefused || !name.MatchString(res.Error) ||
			!strings.Contains(res.Error, "a hook must not leave processes behind") || !strings.Contains(res.Error, "1.0.0 keeps serving") {
			t.Errorf("%s: exit %d, result %+v\nwant refused, naming %s", daemon, r.Code, res, name)
		}
		if Alive(pid) {
			t.Errorf("%s: the daemon (pid %d) still runs after the deploy returned", daemon, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if took > 5*time.Second {
			t.Errorf("%s: the refusal took %s (the hook itself takes a moment)", daemon, took.Round(time.Millisecond))
		}
		if len(res.LastLines) == 0 || res.LastLines[len(res.LastLines)-1] != "hook before: started the daemon" {
			t.Errorf("%s: the hook's output was cut: %q", daemon, res.LastLines)
		}
		t.Logf("%s: refused in %s: %s", daemon, took.Round(time.Millisecond), res.Error)
	}
	requireServing(t, a, port, "1.0.0", fmt.Sprintf("1.0.0-built-%d", os.Getuid()))
	if log := a.Log(); !strings.Contains(log, "hook left a process running; killed") {
		t.Errorf("the agent log does not say what it killed:\n%s", log)
	}
}
