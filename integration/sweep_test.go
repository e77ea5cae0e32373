package integration

import (
	"context"
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

// Tests of issue #26: a worker's grandchild that calls setsid leaves the
// worker's process group and session, and used to outlive every stop,
// holding the inherited listener (it answered for the old release after
// a reload) and the worker's output pipes. Each worker of these apps
// starts two: `setsid sleep`, the simplest case, and the test app's
// -daemon-dir daemon, which serves "version=<release>-daemon" on the
// inherited listener. The sleep closes the listener (fd 3): it is killed
// when its worker exits; the daemon holds it: it gets the worker's stop
// signal with it, and is gone before a reload returns.

// daemonApp is app web at release ver, instances workers on port, each
// starting a setsid sleep and a serving daemon whose pids land in dir.
func daemonApp(port, instances int, ver, dir string) string {
	return daemonAppEnv(port, instances, ver, dir, "")
}

// daemonAppEnv is daemonApp with more entries of its env table (", K = V").
func daemonAppEnv(port, instances int, ver, dir, env string) string {
	return fmt.Sprintf(`[apps.web]
command = ["/bin/sh", "-c", "setsid sleep 3600 3>&- & echo $! > %[4]s/sleep-$$; exec %%TESTAPP%%"]
instances = %[2]d
listen = ["tcp://127.0.0.1:%[1]d"]
ready_timeout = "10s"
stop_timeout = "10s"
env = { TESTAPP_VERSION = %[3]q, TESTAPP_DAEMON_DIR = %[4]q%[5]s }
`, port, instances, ver, dir, env)
}

// leftPIDs reads the pids the workers' children wrote to dir (daemons,
// then sleeps, all); it waits (up to 10 s) until there are want of each.
func leftPIDs(t *testing.T, dir string, want int) (daemons, sleeps, all []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		daemons, sleeps = nil, nil
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			switch {
			case err != nil || perr != nil:
			case strings.HasPrefix(e.Name(), "sleep-"):
				sleeps = append(sleeps, pid)
			default:
				daemons = append(daemons, pid)
			}
		}
		if len(daemons) >= want && len(sleeps) >= want {
			killOnCleanup(t, append(daemons, sleeps...))
			return daemons, sleeps, append(slices.Clone(daemons), sleeps...)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids of setsid children in %s after 10s: daemons %v, sleeps %v; want %d of each", dir, daemons, sleeps,
				want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killOnCleanup SIGKILLs pids when the test ends (a failed test must not
// leave them running: they escaped every group the harness kills).
func killOnCleanup(t *testing.T, pids []int) {
	t.Cleanup(func() {
		for _, p := range pids {
			if Alive(p) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
}

// childDirs returns n new folders for the pids of setsid children; when
// the test ends, every child that wrote its pid in one and still runs
// (its environment names the folder) is SIGKILLed, whatever failed.
func childDirs(t *testing.T, n int) []string {
	var dirs []string
	for range n {
		dirs = append(dirs, t.TempDir())
	}
	t.Cleanup(func() {
		for _, dir := range dirs {
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
				pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
				env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
				if err == nil && Alive(pid) && strings.Contains(string(env), "TESTAPP_DAEMON_DIR="+dir) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	return dirs
}

// requireGone fails unless every pid has exited, at once: the operation
// that returned was to leave none of them.
func requireGone(t *testing.T, what string, pids []int) {
	t.Helper()
	for _, p := range pids {
		if Alive(p) {
			t.Errorf("%s: process %d (a setsid child of an old worker) still runs", what, p)
		}
	}
}

// listenerOf is the socket a daemon serves on (its fd 3), as
// /proc/PID/fd names it ("socket:[INODE]").
func listenerOf(t *testing.T, daemon int) string {
	t.Helper()
	link, err := os.Readlink("/proc/" + strconv.Itoa(daemon) + "/fd/3")
	if err != nil || !strings.HasPrefix(link, "socket:[") {
		t.Fatalf("the listener of daemon %d: %q, %v", daemon, link, err)
	}
	return link
}

// requireReleased fails if one of pids still holds sock: an operation
// that returned was to leave none of them accepting. One that let go of
// it may still be on its way out (a loaded machine takes its time to end
// a process after its files are closed): requireGone checks it later.
func requireReleased(t *testing.T, what string, pids []int, sock string) {
	t.Helper()
	for _, p := range pids {
		dir := "/proc/" + strconv.Itoa(p) + "/fd/"
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if link, _ := os.Readlink(dir + e.Name()); link == sock && Alive(p) {
				t.Errorf("%s: process %d (a setsid child of an old worker) still holds the app's listener %s at fd %s",
					what, p, sock, e.Name())
			}
		}
	}
}

// requireOnly runs a bounded load of new connections on port and fails
// if any response comes from a release other than ver (its workers or
// their daemons).
func requireOnly(t *testing.T, a *Agent, port int, ver string) loadgen.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := loadgen.Run(ctx, loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/", port), Clients: 4,
		MaxRequests: 1500, MaxDuration: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests == 0 || r.Failures != 0 {
		t.Errorf("load after the operation: %s: %v", r, r.Errors)
	}
	for v, n := range r.Versions {
		if v != ver && v != ver+"-daemon" {
			t.Errorf("%d responses from release %s after the operation returned (want %s only): %s\n%s", n, v, ver, r,
				a.Log())
		}
	}
	return r
}

// sweptRE matches the agent's line for each process it killed.
var sweptRE = regexp.MustCompile(`left a process running; killed it: .*?pid=(\d+) command=.*? after=(\S+)`)

// swept returns how many processes the agent's log names as swept, and
// the longest time from a worker's exit to the end of its sweep.
func swept(t *testing.T, a *Agent, mode string) (int, time.Duration) {
	t.Helper()
	var longest time.Duration
	ms := sweptRE.FindAllStringSubmatch(a.Log(), -1)
	for _, m := range ms {
		if testing.Verbose() {
			t.Log(m[0])
		}
		if d, err := time.ParseDuration(m[2]); err == nil {
			longest = max(longest, d)
		}
	}
	if mode != "" && len(ms) > 0 && !strings.Contains(a.Log(), "tracked_by="+mode) &&
		!strings.Contains(a.Log(), `tracked_by="`+mode) {
		t.Errorf("the sweep's log lines do not say tracked_by=%q", mode)
	}
	return len(ms), longest
}

// sweepModes runs f with the cgroup (where the agent can make one) and
// with the fallback sweep forced.
func sweepModes(t *testing.T, f func(t *testing.T, env []string, mode string)) {
	t.Run("cgroup", func(t *testing.T) {
		if os.Geteuid() != 0 {
			skipOrFail(t, "not root: the agent can make no cgroup")
		}
		f(t, nil, "cgroup")
	})
	t.Run("sweep", func(t *testing.T) {
		f(t, []string{"DEPLOYD_TEST_NO_CGROUP=1"}, "process group and marker sweep")
	})
}

// reloadSweeps reloads web from the workers old (their setsid children in
// d1) to release ver (children in d2): when the reload returns, the old
// daemons that held the listener hold it no more and only ver answers;
// once the old workers have drained, nothing of them is left, and the log
// names each sleep as swept.
func reloadSweeps(t *testing.T, a *Agent, port int, old []int, d1, d2, ver, mode string) {
	t.Helper()
	reloadSweepsTo(t, a, port, old, d1, daemonApp(port, 2, ver, d2), ver, mode)
}

// reloadSweepsTo is reloadSweeps to the config conf of release ver.
func reloadSweepsTo(t *testing.T, a *Agent, port int, old []int, d1, conf, ver, mode string) {
	t.Helper()
	daemons, sleeps, _ := leftPIDs(t, d1, 2)
	sock := listenerOf(t, daemons[0])
	a.WriteConfig(conf)
	if r := a.CLIWithin(time.Minute, "reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	requireReleased(t, "when the reload returned", daemons, sock)
	res := requireOnly(t, a, port, ver)
	if t.Failed() {
		t.Logf("the agent's log:\n%s", a.Log())
	}
	for _, p := range old {
		waitExited(t, p, 20*time.Second)
	}
	requireGone(t, "the old workers' drain (20s)", old)
	requireGone(t, "once the old workers exited", append(slices.Clone(sleeps), daemons...))
	n, longest := swept(t, a, mode)
	t.Logf("%s: reload: the daemons let go of the listener before it returned, then %d processes swept (the longest %s "+
		"after its worker's exit); a load after it: %s", mode, n, longest, res)
	for _, p := range sleeps {
		if !strings.Contains(a.Log(), "pid="+strconv.Itoa(p)+" command=\"sleep 3600\"") {
			t.Errorf("the log does not name the swept sleep %d\n%s", p, a.Log())
		}
	}
}

// A reload, a crash of a worker, a scale down and a stop each leave none
// of the setsid children of the workers they end, and after the reload
// returned no request is answered by the old release.
func TestSetsidChildrenSweptOnReloadCrashScaleStop(t *testing.T) {
	parallel(t)
	sweepModes(t, func(t *testing.T, env []string, mode string) {
		port := FreePort(t)
		dirs := childDirs(t, 2)
		d1, d2 := dirs[0], dirs[1]
		a := NewAgentDir(t, bins, daemonApp(port, 2, "v1", d1))
		a.Env = env
		a.Start()
		old := workerPIDs(a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) }))
		reloadSweeps(t, a, port, old, d1, d2, "v2", mode)

		// A crash of the worker itself: what it left is killed before the
		// slot restarts.
		_, _, cur := leftPIDs(t, d2, 2)
		victim := appOf(a.Status(), "web").Workers[0].PID
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		a.WaitFor("slot restarted", 20*time.Second, func(st *api.Status) bool {
			return AllReady(st, "web", 2) && !slices.Contains(workerPIDs(st), victim) &&
				strings.Contains(a.Log(), "before its slot restarts")
		})
		gone := 0
		for _, p := range cur {
			if !Alive(p) {
				gone++
			}
		}
		if gone != 2 {
			t.Errorf("after the crash of worker %d, %d of the children %v are gone, want its 2", victim, gone, cur)
		}

		// Scale down to 1, then stop: nothing of the workers is left.
		_, _, all := leftPIDs(t, d2, 3)
		if r := a.CLIWithin(time.Minute, "scale", "web", "1"); r.Code != 0 {
			t.Fatalf("scale 1: exit %d\n%s", r.Code, r.Stderr)
		}
		alive := 0
		for _, p := range all {
			if Alive(p) {
				alive++
			}
		}
		if alive != 2 {
			t.Errorf("after scale 1: %d setsid children alive, want the 2 of the last worker", alive)
		}
		if r := a.CLIWithin(time.Minute, "stop", "web"); r.Code != 0 {
			t.Fatalf("stop: exit %d\n%s", r.Code, r.Stderr)
		}
		requireGone(t, "after stop", all)
		n, longest := swept(t, a, mode)
		t.Logf("%s: in all: %d processes swept, the longest %s after its worker's exit", mode, n, longest)
	})
}

// The sweep goes on across an agent upgrade and an agent SIGKILL: the
// adopted workers' units are found again, and a reload then leaves none
// of the old release's setsid children.
func TestSetsidChildrenSweptAfterAdoption(t *testing.T) {
	parallel(t)
	for _, how := range []string{"upgrade", "sigkill"} {
		t.Run(how, func(t *testing.T) {
			sweepModes(t, func(t *testing.T, env []string, mode string) {
				port := FreePort(t)
				dirs := childDirs(t, 2)
				d1, d2 := dirs[0], dirs[1]
				a := NewAgentDir(t, bins, daemonApp(port, 2, "v1", d1))
				a.Env = env
				a.UseOwnBinary()
				a.Start()
				before := workerPIDs(a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool {
					return AllReady(st, "web", 2)
				}))
				_, _, children := leftPIDs(t, d1, 2)
				switch how {
				case "upgrade":
					cand := filepath.Join(t.TempDir(), "deployd-new")
					CopyFile(t, bins.DeploydV2, cand)
					if r := a.CLIWithin(time.Minute, "upgrade", "--binary", cand); r.Code != 0 {
						t.Fatalf("upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
					}
				case "sigkill":
					a.KillAndAwait(t)
					a.Start()
				}
				after := workerPIDs(a.WaitFor("adopted", 30*time.Second, func(st *api.Status) bool {
					return AllReady(st, "web", 2)
				}))
				slices.Sort(before)
				slices.Sort(after)
				if !slices.Equal(after, before) {
					t.Fatalf("workers %v after the %s, want the adopted %v", after, how, before)
				}
				for _, p := range children {
					if !Alive(p) {
						t.Fatalf("the %s killed setsid child %d of a running worker\n%s", how, p, a.Log())
					}
				}
				reloadSweeps(t, a, port, before, d1, d2, "v2", mode)
				leftPIDs(t, d2, 2) // killed at the end, should the agent's stop fail
			})
		})
	}
}

// A reload returns only once no daemon of an old worker holds the app's
// listener, even when the old worker exits at once on its stop signal and
// its exit sweep, not the reload, took its daemons over (issue 40: the
// reload returned while the sweep was still killing one). The daemons
// ignore SIGTERM and the agent's exit sweep holds 3 s before it kills
// them (failpoint.EnvSweepHold, a sweep slowed by a loaded machine): on
// the old code the reload returned with both daemons still serving v1.
// With fresh workers and with workers adopted after an agent SIGKILL.
func TestReloadWaitsForTheExitSweepOfEscapedDaemons(t *testing.T) {
	parallel(t)
	for _, how := range []string{"fresh", "sigkill"} {
		t.Run(how, func(t *testing.T) {
			sweepModes(t, func(t *testing.T, env []string, mode string) {
				port := FreePort(t)
				dirs := childDirs(t, 2)
				d1, d2 := dirs[0], dirs[1]
				a := NewAgentDir(t, bins, daemonAppEnv(port, 2, "v1", d1,
					", TESTAPP_ABRUPT_SIGTERM = \"1\", TESTAPP_DAEMON_IGNORE_SIGTERM = \"1\""))
				a.Env = append(slices.Clone(env), "DEPLOYD_TEST_SWEEP_HOLD=3s")
				a.UseOwnBinary()
				a.Start()
				old := workerPIDs(a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool {
					return AllReady(st, "web", 2)
				}))
				if how == "sigkill" {
					a.KillAndAwait(t)
					a.Start()
					after := workerPIDs(a.WaitFor("adopted", 30*time.Second, func(st *api.Status) bool {
						return AllReady(st, "web", 2)
					}))
					if slices.Sort(after); !slices.Equal(after, slices.Sorted(slices.Values(old))) {
						t.Fatalf("workers %v after the agent SIGKILL, want the adopted %v", after, old)
					}
				}
				start := time.Now()
				reloadSweepsTo(t, a, port, old, d1, daemonApp(port, 2, "v2", d2), "v2", mode)
				t.Logf("%s/%s: the reload and its checks took %s (the exit sweeps held 3s each)", how, mode,
					time.Since(start).Round(time.Millisecond))
				leftPIDs(t, d2, 2) // killed at the end, should the agent's stop fail
			})
		})
	}
}

// A worker that a dead agent left and the next cannot adopt (its app
// changed while no agent ran), or that died too while no agent ran, is
// retired: what it left running is killed, by the unit in the dead
// agent's record.
func TestSetsidChildrenOfRetiredSurvivorsKilled(t *testing.T) {
	parallel(t)
	for _, how := range []string{"app changed", "worker died"} {
		t.Run(strings.ReplaceAll(how, " ", "-"), func(t *testing.T) {
			sweepModes(t, func(t *testing.T, env []string, mode string) {
				port := FreePort(t)
				dirs := childDirs(t, 2)
				d1, d2 := dirs[0], dirs[1]
				a := NewAgentDir(t, bins, daemonApp(port, 1, "v1", d1))
				a.Env = env
				a.Start()
				old := workerPIDs(a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool {
					return AllReady(st, "web", 1)
				}))
				_, _, children := leftPIDs(t, d1, 1)
				a.KillAndAwait(t)
				want := "worker exited and left a process running; killed it"
				if how == "worker died" {
					if err := syscall.Kill(old[0], syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
					waitExited(t, old[0], 10*time.Second)
					want = "a worker left by an agent that died had exited, and left a process running; killed it"
				} else {
					a.WriteConfig(daemonApp(port, 1, "v2", d2))
				}
				a.Start()
				a.WaitFor("a new worker ready, and the log naming the killed children", 30*time.Second,
					func(st *api.Status) bool {
						return AllReady(st, "web", 1) && !slices.Contains(workerPIDs(st), old[0]) &&
							strings.Count(a.Log(), want) >= 1
					})
				for _, p := range children {
					waitExited(t, p, 10*time.Second)
				}
				requireGone(t, "once the survivor was retired", children)
				t.Logf("%s, %s: survivor %d retired; %d of its setsid children named as killed", how, mode, old[0],
					strings.Count(a.Log(), want))
			})
		})
	}
}
