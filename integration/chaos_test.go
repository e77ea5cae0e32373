package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// The chaos tests SIGKILL a random worker every 200–500 ms while clients run
// (and, in the second one, while `deployd reload` runs in a loop), and check
// that the shared listener never refuses a connection, that failed requests
// stay within what the killed workers had in flight, and that the pool comes
// back to full strength after every kill.
//
// DEPLOYD_SOAK=1 runs them for a minute each (benchmark mode); in CI they run
// for chaosCIDuration. DEPLOYD_CHAOS_SEED=N replays a run's kill sequence.

const (
	chaosInstances  = 3
	chaosClients    = 50 // per load: startLoad runs a keep-alive and a new-connection load
	chaosCIDuration = 8 * time.Second
	chaosSoak       = 60 * time.Second
	// chaosSlackPerKill bounds, per kill and load, the connections a worker
	// accepts between the test counting its sockets and its SIGKILL.
	chaosSlackPerKill = 1
)

// isSoak reports whether DEPLOYD_SOAK=1 asks for the long benchmark runs.
func isSoak() bool { return os.Getenv("DEPLOYD_SOAK") == "1" }

func chaosDuration() time.Duration {
	if isSoak() {
		return chaosSoak
	}
	return chaosCIDuration
}

// chaosRand returns the run's random source and logs its seed.
func chaosRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DEPLOYD_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DEPLOYD_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("chaos seed %d (replay with DEPLOYD_CHAOS_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// chaosApp is the web app at version ver with a crash policy that never gives
// up: the kills are the test's, not the app's fault. No min_ready bake: a kill
// of a new worker abandons its reload anyway (before the reload ends), and a
// 1 s bake per slot would leave no reload a chance to finish between kills.
func chaosApp(port int, ver string) string {
	return versionedApp(port, chaosInstances, ver, "", `min_ready = "0s"
[apps.web.restart]
backoff = "10ms"
max_backoff = "50ms"
max_restarts = 1000000
window = "1m"
`)
}

func TestChaosKillsUnderLoad(t *testing.T) { runChaos(t, false) }

func TestChaosKillsDuringReloads(t *testing.T) { runChaos(t, true) }

func runChaos(t *testing.T, withReloads bool) {
	rng := chaosRand(t)
	d := chaosDuration()
	port := FreePort(t)
	a := StartAgent(t, bins, chaosApp(port, "v1"))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", chaosInstances) })

	var loop *reloadLoop
	if withReloads {
		loop = startReloadLoop(t, a, [2]string{chaosApp(port, "v1"), chaosApp(port, "v2")})
	}
	stopLoad := startLoad(t, port, chaosClients, d+time.Minute)
	stopProbe := startDialProbe(port)
	k := killWorkers(t, a, rng, time.Now().Add(d), withReloads)
	probe := stopProbe()
	ka, nka := stopLoad()
	serving := "v1"
	if loop != nil {
		serving = finishReloadLoop(t, a, port, loop)
	}
	st := a.WaitFor("full strength at the end", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", chaosInstances) && appOf(st, "web").State == "running"
	})
	t.Logf("%d kills in %s; recovery to full strength: %s; restarts counted by the agent: %d",
		k.kills, d, k.summary(), appOf(st, "web").Restarts)
	if k.kills < int(d/time.Second) {
		t.Errorf("only %d kills in %s: the chaos loop stalled", k.kills, d)
	}
	t.Logf("dial probe: %d connects, %d refused, %d other errors %v", probe.dials, probe.refused, probe.other, probe.errs)
	if probe.refused > 0 || probe.other > 0 {
		t.Errorf("the shared listener must accept every connection while workers die: %d refused, %d other dial errors: %v",
			probe.refused, probe.other, probe.errs)
	}
	t.Logf("connections open on the killed workers at their SIGKILL: %d; failed requests: %d keep-alive + %d new-connection",
		k.inFlight, ka.Failures, nka.Failures)
	checkChaosLoad(t, "keep-alive clients", ka)
	checkChaosLoad(t, "new-connection clients", nka)
	// A kill can only fail the requests on connections the killed worker held:
	// those counted just before its SIGKILL, plus the ones it accepted between
	// that count and the signal (chaosSlackPerKill per kill and load, stated).
	failed := ka.Failures + nka.Failures
	if limit := int64(k.inFlight + 2*chaosSlackPerKill*k.kills); failed > limit {
		t.Errorf("%d failed requests, more than the %d connections the killed workers held + %d slack (%d kills)",
			failed, k.inFlight, 2*chaosSlackPerKill*k.kills, k.kills)
	}
	// Every kill is a crash the agent must count and restart, and nothing
	// else crashed: without reloads the restart count equals the kills.
	if restarts := appOf(st, "web").Restarts; !withReloads && restarts != k.kills {
		t.Errorf("the agent counted %d restarts for %d kills", restarts, k.kills)
	} else if withReloads && (restarts > k.kills || restarts == 0) {
		t.Errorf("the agent counted %d restarts for %d kills (some kills hit a new worker of an abandoned reload)", restarts, k.kills)
	}
	for pid, v := range identities(t, port, PIDs(appOf(st, "web"))) {
		if v != serving {
			t.Errorf("worker %d answers %s after the run, want %s", pid, v, serving)
		}
	}
	if z := zombieChildren(a.PID()); len(z) > 0 {
		t.Errorf("zombie children of the agent after the run: %v", z)
	}
}

// finishReloadLoop stops the loop, reports it, and runs one last reload with
// no kills, which must bring every slot to the config's version; it returns
// that version.
func finishReloadLoop(t *testing.T, a *Agent, port int, loop *reloadLoop) string {
	t.Helper()
	rs := loop.stop()
	t.Logf("reloads: %d done, %d abandoned (a kill hit a new worker before it was ready); versions %v",
		rs.done, rs.abandoned, rs.versions)
	for _, e := range rs.errs {
		t.Errorf("reload loop: %s", e)
	}
	if rs.done == 0 {
		t.Errorf("no reload completed during the chaos run")
	}
	// A kill can also hit the new worker of a rollback; that slot then keeps
	// the new version (the agent logs it). Show what the loop left.
	st := a.WaitFor("full strength after the loop", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", chaosInstances)
	})
	served := map[string]int{}
	for _, v := range identities(t, port, PIDs(appOf(st, "web"))) {
		served[v]++
	}
	t.Logf("workers per version after the reload loop: %v (config at %s)", served, rs.configVersion)
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("final reload after the chaos run: exit %d\n%s", r.Code, r.Stderr)
	}
	return rs.configVersion
}

// checkChaosLoad checks one load: it sent requests, and no connection was
// refused (Refused counts every refusal; the dial probe checks the same with
// plain connects).
//
// loadgen counts a new connection reset before any answer as a connect
// error; a SIGKILLed worker resets the connections it had accepted and not
// answered, so those are part of Failures here, not refusals.
func checkChaosLoad(t *testing.T, what string, r loadgen.Result) {
	t.Helper()
	t.Logf("%s: %s", what, r)
	if len(r.Errors) > 0 {
		t.Logf("%s: first failures: %s", what, strings.Join(r.Errors[:min(len(r.Errors), 3)], "; "))
	}
	if r.Requests == 0 {
		t.Errorf("%s: the load sent no request", what)
	}
	if r.Refused > 0 {
		t.Errorf("%s: %d connections were refused", what, r.Refused)
	}
}

// killStats is what the kill loop did.
type killStats struct {
	kills int
	// inFlight counts the connections the killed workers held just before
	// their SIGKILL: the requests a kill can fail.
	inFlight int
	recovery []time.Duration // from each SIGKILL until the pool was at full strength
}

func (k killStats) summary() string {
	if len(k.recovery) == 0 {
		return "n/a"
	}
	s := slices.Clone(k.recovery)
	slices.Sort(s)
	return fmt.Sprintf("median %s, max %s", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// killWorkers SIGKILLs a random worker of web every 200–500 ms until
// deadline, and after each kill waits until the pool is at full strength.
// During reloads any worker may be hit (a starting one abandons the reload);
// otherwise only ready ones.
func killWorkers(t *testing.T, a *Agent, rng *rand.Rand, deadline time.Time, anyState bool) killStats {
	t.Helper()
	var k killStats
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(200+rng.IntN(301)) * time.Millisecond)
		app := a.App("web")
		if app.State == "errored" {
			t.Fatalf("app errored under chaos: %s\n%s", app.LastExit, a.Log())
		}
		var targets []int
		for _, w := range app.Workers {
			if w.PID > 0 && (anyState || w.State == "ready") {
				targets = append(targets, w.PID)
			}
		}
		if len(targets) == 0 {
			continue
		}
		pid := targets[rng.IntN(len(targets))]
		// Only ever kill a child of this agent (the pid may have exited and
		// been reused since the status call).
		if _, ppid, err := procStat(pid); err != nil || ppid != a.PID() {
			continue
		}
		conns := openSockets(pid) - 1 // less the shared listener
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			continue
		}
		t0 := time.Now()
		k.kills++
		k.inFlight += max(conns, 0)
		a.WaitFor(fmt.Sprintf("full strength after kill %d (pid %d)", k.kills, pid), 20*time.Second,
			func(st *api.Status) bool { return fullStrength(st, pid) })
		k.recovery = append(k.recovery, time.Since(t0))
	}
	return k
}

// fullStrength: at least chaosInstances ready workers serve web, none of
// them the killed one (during a reload an old worker and its replacement
// may both be ready for a moment).
func fullStrength(st *api.Status, killed int) bool {
	ready := 0
	for _, w := range appOf(st, "web").Workers {
		if w.PID == killed {
			return false
		}
		if w.State == "ready" {
			ready++
		}
	}
	return ready >= chaosInstances
}

// reloadLoop runs `deployd reload web` over and over, alternating between two
// configs, until stopped.
type reloadLoop struct {
	quit chan struct{}
	done chan reloadLoopResult
}

type reloadLoopResult struct {
	done, abandoned int
	versions        map[string]int // completed reloads per version
	configVersion   string         // the version in the config file at the end
	errs            []string
}

// startReloadLoop starts the loop; bodies are the v1 and v2 configs. Config
// files are replaced by rename, so the agent never reads half a file.
func startReloadLoop(t *testing.T, a *Agent, bodies [2]string) *reloadLoop {
	t.Helper()
	var files [2][]byte
	for _, i := range []int{1, 0} { // the file ends with v1, the running version
		a.WriteConfig(bodies[i])
		b, err := os.ReadFile(a.Config)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = b
	}
	l := &reloadLoop{quit: make(chan struct{}), done: make(chan reloadLoopResult, 1)}
	go func() {
		res := reloadLoopResult{versions: map[string]int{}, configVersion: "v1"}
		defer func() { l.done <- res }()
		for i := 1; ; i++ {
			select {
			case <-l.quit:
				return
			default:
			}
			ver := fmt.Sprintf("v%d", 1+i%2)
			tmp := a.Config + ".tmp"
			if err := os.WriteFile(tmp, files[i%2], 0o644); err != nil {
				res.errs = append(res.errs, err.Error())
				return
			}
			if err := os.Rename(tmp, a.Config); err != nil {
				res.errs = append(res.errs, err.Error())
				return
			}
			res.configVersion = ver
			outcome, err := cliReload(a)
			switch {
			case err != nil:
				res.errs = append(res.errs, fmt.Sprintf("reload %d to %s: %v", i, ver, err))
			case outcome == api.OutcomeDone:
				res.done++
				res.versions[ver]++
			case outcome == api.OutcomeAbandoned:
				res.abandoned++
			default:
				res.errs = append(res.errs, fmt.Sprintf("reload %d to %s: outcome %q", i, ver, outcome))
			}
		}
	}()
	t.Cleanup(func() { l.stop() })
	return l
}

// stop ends the loop after the reload in progress and returns its result.
// Safe to call twice.
func (l *reloadLoop) stop() reloadLoopResult {
	select {
	case <-l.quit:
	default:
		close(l.quit)
	}
	res := <-l.done
	l.done <- res
	return res
}

// cliReload runs `deployd reload web --json` and returns the app's outcome.
// It is safe to call from any goroutine (it never touches testing.T).
func cliReload(a *Agent) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.Deployd, "reload", "web", "--json")
	cmd.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return "", err
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res api.Result
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &res); jerr != nil || len(res.Apps) != 1 {
		return "", fmt.Errorf("exit %v, no result line: %s%s", err, out.String(), errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); (code == 0) != (res.Apps[0].Outcome == api.OutcomeDone) {
		return "", fmt.Errorf("exit %d with outcome %s", code, res.Apps[0].Outcome)
	}
	return res.Apps[0].Outcome, nil
}

// openSockets counts the sockets pid has open.
func openSockets(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, _ := os.ReadDir(dir)
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// probeResult counts plain TCP connects to the app's port.
type probeResult struct {
	dials, refused, other int
	errs                  []string // first few other errors
}

// startDialProbe connects to port (and closes at once) every millisecond
// until stopped: a refused connect means no process held the listener.
func startDialProbe(port int) (stop func() probeResult) {
	quit := make(chan struct{})
	done := make(chan probeResult, 1)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	go func() {
		var r probeResult
		defer func() { done <- r }()
		for {
			select {
			case <-quit:
				return
			case <-time.After(time.Millisecond):
			}
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			r.dials++
			switch {
			case err == nil:
				c.Close()
			case errors.Is(err, syscall.ECONNREFUSED):
				r.refused++
			default:
				r.other++
				if len(r.errs) < 3 {
					r.errs = append(r.errs, err.Error())
				}
			}
		}
	}()
	return func() probeResult { close(quit); return <-done }
}
