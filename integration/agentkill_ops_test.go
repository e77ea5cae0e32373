package integration

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestAgentKillDuringReloadKeepsServing SIGKILLs the agent while a reload
// of web (2 workers, v1 to v2) waits for its first new worker, which holds
// its readiness until the test lets it. The CLI's reload says the outcome
// is unknown; the next agent takes the half-done reload over: the v1
// workers serve on (adopted aside) until v2 is ready, the v2 worker the
// dead agent started is adopted (same pid), and then v1 is retired. No
// request fails under both loads, status lists every worker process of the
// test, and a worker killed afterwards is restarted.
func TestAgentKillDuringReloadKeepsServing(t *testing.T) {
	port := FreePort(t)
	const n = 2
	a := NewAgentDir(t, bins, appConfig("web", port, n, ""))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
	v1 := allWorkerPIDs(st)
	stop := startLoad(t, port, 4, 2*time.Minute)

	gate := filepath.Join(a.Dir, "gate")
	a.WriteConfig(appConfig("web", port, n, `env = { TESTAPP_VERSION = "v2", TESTAPP_READY_FILE = "`+gate+`" }`))
	reload := a.startCLI("reload", "web")
	// Once the new worker runs the app (past deployd's shim, which does not
	// outlive an agent that dies before it execs the app).
	st = a.WaitFor("a v2 worker started", 20*time.Second, func(st *api.Status) bool {
		for pid := range newPIDs(allWorkerPIDs(st), v1) {
			if exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe")); filepath.Base(exe) == filepath.Base(bins.TestApp) {
				return true
			}
		}
		return false
	})
	started := newPIDs(allWorkerPIDs(st), v1)
	killAgent(t, a)
	r := reload.wait(t)
	t.Logf("reload while its agent was SIGKILLed: exit %d, %q", r.Code, strings.TrimSpace(r.Stderr))
	if r.Code == 0 || !strings.Contains(r.Stderr, "stopped answering during the operation") {
		t.Errorf("reload: exit %d, stderr %q: want a failure that says the agent stopped answering", r.Code, r.Stderr)
	}

	recorded := recordedPIDs(t, a.Dir)
	a.Start()
	st = a.Status()
	if app := appOf(st, "web"); app.State == "" {
		t.Fatalf("the next agent does not list web: %+v", st)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st = a.WaitFor("v2 ready", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", n) && len(newPIDs(allWorkerPIDs(st), v1)) == n
	})
	// The dead agent's v2 worker is adopted if its record named it; if the
	// agent died before it wrote that record, it is a stray, retired once
	// the next agent serves (requireNoStrays waits for that).
	now := allWorkerPIDs(st)
	for pid := range started {
		switch {
		case recorded[pid] && !now[pid]:
			t.Errorf("v2 worker %d, which the dead agent's record names, was not adopted: workers now %v\n%s", pid, keys(now), a.Log())
		case recorded[pid]:
			t.Logf("v2 worker %d the dead agent started is adopted", pid)
		default:
			t.Logf("v2 worker %d the dead agent started had no record yet: a stray, retired", pid)
		}
	}
	waitAllGone(t, v1, 20*time.Second)
	for range 4 {
		if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "version=v2") {
			t.Errorf("after the reload was taken over: %q, %v; want version=v2", body, err)
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "agent SIGKILL during a reload", ka, nka)
	requireSupervised(t, a, n)
	requireNoStrays(t, a)
	t.Logf("v1 %v retired after v2 %v was ready", keys(v1), keys(now))
}

// TestAgentKillDuringUpgradeKeepsServing SIGKILLs the agent that runs
// `deployd upgrade` once its successor has started, and then (the second
// round) the successor while it takes over. Either way an agent serves
// afterwards (the successor, or one started as systemd's Restart= would)
// with the same worker pids, the CLI's upgrade ends with a clear outcome,
// no request fails, status lists every worker process, a worker killed
// afterwards is restarted, and every tick line is in the log exactly once.
func TestAgentKillDuringUpgradeKeepsServing(t *testing.T) {
	port := FreePort(t)
	const n = 2
	a := NewAgentDir(t, bins, abruptApp(port, n, ""))
	a.UseOwnBinary()
	// A handoff takes milliseconds on a quiet machine: the failpoint keeps
	// both agents alive for 3 s, so that the kill lands during it.
	a.Env = append(a.Env, "DEPLOYD_TEST_HANDOFF_HOLD=3s")
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
	before := allWorkerPIDs(st)
	stop := startLoad(t, port, 4, 2*time.Minute)
	for _, victim := range []string{"old", "new"} {
		old, _ := agentPID(t, a)
		up := a.startCLI("upgrade")
		child := waitChild(t, old, 20*time.Second)
		pid := old
		if victim == "new" {
			pid = child
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r := up.wait(t)
		t.Logf("upgrade, %s agent SIGKILLed during it: exit %d, %q", victim, r.Code, strings.TrimSpace(lastLine(r.Stderr+r.Stdout)))
		if victim == "new" && r.Code == 0 {
			t.Errorf("upgrade whose new agent was SIGKILLed: exit 0\n%s", r.Stdout)
		}
		waitExited(t, pid, 10*time.Second)
		serving := a.agentAnswers()
		if !serving {
			a.Start() // what Restart= does
		}
		st = a.WaitFor("workers adopted", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
		if now := allWorkerPIDs(st); !maps.Equal(now, before) {
			t.Fatalf("%s agent killed during an upgrade: workers %v, before %v\n%s", victim, keys(now), keys(before), a.Log())
		}
		t.Logf("%s agent killed during an upgrade: agent %d serves (%s) with the same workers", victim,
			st.Agent.PID, map[bool]string{true: "it survived", false: "started after it"}[serving])
	}
	ka, nka := stop()
	requireNoFailures(t, "agent SIGKILLs during upgrades", ka, nka)
	requireNoStrays(t, a)
	requireSupervised(t, a, n)
	a.Stop()
	checkTicksAcrossKills(t, ticks(t, a.Dir), before, 2)
}

// cliRun is a CLI command running in the background.
type cliRun struct {
	cmd      *exec.Cmd
	out, err bytes.Buffer
	done     chan error
	cancel   context.CancelFunc
}

// startCLI starts the CLI against a in the background, with the harness's
// deadline.
func (a *Agent) startCLI(args ...string) *cliRun {
	a.t.Helper()
	ctx, cancel := a.Ctx(0)
	c := &cliRun{done: make(chan error, 1), cancel: cancel}
	c.cmd = exec.CommandContext(ctx, a.bins.Deployd, args...)
	c.cmd.Dir = a.Dir
	c.cmd.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.err
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		cancel()
		a.t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	a.t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// wait waits for the command (within the harness's deadline) and returns
// its result.
func (c *cliRun) wait(t *testing.T) Result {
	t.Helper()
	err := <-c.done
	c.done <- err // for the cleanup
	r := Result{Stdout: c.out.String(), Stderr: c.err.String()}
	if err != nil {
		r.Code = c.cmd.ProcessState.ExitCode()
		if r.Code < 0 {
			t.Fatalf("deployd %v did not end: %v", c.cmd.Args[1:], err)
		}
	}
	return r
}

// newPIDs returns the pids of now that are not in old.
func newPIDs(now, old map[int]bool) map[int]bool {
	out := map[int]bool{}
	for p := range now {
		if !old[p] {
			out[p] = true
		}
	}
	return out
}

// killAgent SIGKILLs the agent serving a's socket and waits until it is gone.
func killAgent(t *testing.T, a *Agent) {
	t.Helper()
	pid, _ := agentPID(t, a)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid, 10*time.Second)
}

// agentAnswers reports whether an agent answers on a's socket.
func (a *Agent) agentAnswers() bool {
	ctx, cancel := a.Ctx(2 * time.Second)
	defer cancel()
	_, err := a.Client.Version(ctx)
	return err == nil
}

// waitChild waits until process parent has a child process (the new agent
// of an upgrade) and returns its pid.
func waitChild(t *testing.T, parent int, bound time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		var b []byte // each thread's children
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(parent), "task", "*", "children"))
		for _, f := range tasks {
			c, _ := os.ReadFile(f)
			b = append(append(b, c...), ' ')
		}
		for _, f := range strings.Fields(string(b)) {
			comm, _ := os.ReadFile(filepath.Join("/proc", f, "comm"))
			if pid, _ := strconv.Atoi(f); pid > 0 && strings.HasPrefix(string(comm), "deployd") {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %d started no new agent within %s", parent, bound)
		}
		time.Sleep(time.Millisecond)
	}
}

// requireSupervised SIGKILLs one worker of web and waits until it is
// restarted: the agent supervises what it adopted.
func requireSupervised(t *testing.T, a *Agent, n int) {
	t.Helper()
	st := a.Status()
	w := appOf(st, "web").Workers[0]
	restarts := appOf(st, "web").Restarts
	if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.WaitFor("the killed worker restarted", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", n) && !allWorkerPIDs(st)[w.PID] && appOf(st, "web").Restarts == restarts+1
	})
}

// requireNoStrays fails unless, within 20 s (a stray is retired with
// SIGTERM once the agent serves), every process of this test's agents (by
// its NOTIFY_SOCKET) is among the workers status lists.
func requireNoStrays(t *testing.T, a *Agent) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		listed := allWorkerPIDs(a.Status())
		var strays []int
		for pid := range addTestWorkers(t, a.Dir, nil) {
			if !listed[pid] {
				strays = append(strays, pid)
			}
		}
		if len(strays) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of this test's agents run, but status lists %v\n%s", strays, keys(listed), a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestAgentKillsMidBurstLoseNoLine SIGKILLs the agent 5 times while both
// workers of web print 1 000 000 numbered lines each as fast as they can,
// each time once the log has grown under the current agent: the lines the
// killed agent had taken out of a pipe and not yet written are in the
// worker's journal for the next agent, so every line is in the log exactly
// once (with lines read into the agent's memory, each such kill lost
// thousands).
func TestAgentKillsMidBurstLoseNoLine(t *testing.T) {
	port := FreePort(t)
	const n, kills, lines = 2, 5, 1_000_000
	a := NewAgentDir(t, bins, appConfig("web", port, n, fmt.Sprintf(`env = { TESTAPP_LOG_SPAM = "%d" }`, lines)))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
	before := allWorkerPIDs(st)
	logs := filepath.Join(a.Dir, "logs")
	for i := range kills {
		size := dirBytes(logs)
		for deadline := time.Now().Add(20 * time.Second); dirBytes(logs) == size; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: the log did not grow in 20 s (the burst ended too early?)", i+1)
			}
		}
		killAgent(t, a)
		a.Start()
		st = a.WaitFor("workers adopted", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", n) })
		if now := allWorkerPIDs(st); !maps.Equal(now, before) {
			t.Fatalf("kill %d: workers %v, before %v: not adopted", i+1, keys(now), keys(before))
		}
	}
	var counts map[int]map[int]int
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		counts = numbered(t, logs, "line")
		done := true
		for pid := range before {
			done = done && counts[pid][lines] > 0
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last line of each worker not in the log within 2 minutes of the last kill")
		}
	}
	a.Stop()
	for pid := range before {
		var missing, dup int
		for k := 1; k <= lines; k++ {
			switch counts[pid][k] {
			case 0:
				missing++
			case 1:
			default:
				dup++
			}
		}
		if missing+dup > 0 {
			t.Errorf("worker %d: of lines 1..%d across %d kills, %d missing, %d repeated", pid, lines, kills, missing, dup)
		} else {
			t.Logf("worker %d: lines 1..%d each once across %d kills", pid, lines, kills)
		}
	}
}

// recordedPIDs returns the worker pids that the agents' records in
// dir/state/agents name.
func recordedPIDs(t *testing.T, dir string) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	files, _ := filepath.Glob(filepath.Join(dir, "state", "agents", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range pidField.FindAllSubmatch(b, -1) {
			pid, _ := strconv.Atoi(string(m[1]))
			out[pid] = true
		}
	}
	return out
}

var pidField = regexp.MustCompile(`"pid":\s*(\d+)`)

// dirBytes is the size of the files in dir together.
func dirBytes(dir string) int64 {
	var n int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// numbered counts the lines "PREFIX <slot> <pid> <n>" of web's stdout log
// in dir (the current file and the rotated ones), by pid and n.
func numbered(t *testing.T, dir, prefix string) map[int]map[int]int {
	t.Helper()
	out := map[int]map[int]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "web.out*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			_, rest, ok := strings.Cut(l, "] "+prefix+" ")
			if !ok {
				continue
			}
			fs := strings.Fields(rest)
			if len(fs) != 3 {
				continue
			}
			pid, _ := strconv.Atoi(fs[1])
			k, _ := strconv.Atoi(fs[2])
			if out[pid] == nil {
				out[pid] = map[int]int{}
			}
			out[pid][k]++
		}
	}
	return out
}
