package integration

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// The randomized operation run: a seeded sequence of operations on a real
// agent, each checked against a model of what must be true after it.
// `go test` runs a short fixed-seed sequence; -ops.steps=1000 runs a long
// one, -ops.seed=N replays a failure (the seed is printed with every
// failure).
var (
	opsSteps = flag.Int("ops.steps", 0, "steps of TestRandomOperations (0: the short default)")
	opsSeed  = flag.Uint64("ops.seed", 0, "seed of TestRandomOperations (0: the fixed default; replay a failure with the seed it printed)")
)

// modelApp is what the model says of one app.
type modelApp struct {
	port      int
	instances int // in the config
	scaled    int // by `deployd scale` (0: none), persisted in state.json
	version   string
	stopped   bool // by `deployd stop`, persisted in state.json

	// An app that takes releases (releases = true): version is its
	// current release ("" before the first deploy: no workers), previous
	// the one before it, installed every release on disk.
	releases  bool
	previous  string
	installed []string
}

// want is the number of workers the app must run.
func (m *modelApp) want() int {
	if m.stopped || (m.releases && m.version == "") {
		return 0
	}
	if m.scaled > 0 {
		return m.scaled
	}
	return m.instances
}

// opsRun is one randomized run: the agent, the model, the random source.
type opsRun struct {
	t       *testing.T
	a       *Agent
	rng     *rand.Rand
	seed    uint64
	step    int
	apps    map[string]*modelApp
	removed map[string]int       // app -> the port it had, for apps removed from the config
	gone    map[string]*modelApp // apps removed from the config, as they were
	names   []string             // the pool of app names the generator draws from
	nextVer int
	log     []string // the steps so far, printed with a failure
}

func TestRandomOperations(t *testing.T) {
	parallel(t)
	steps, seed := 24, uint64(20261202)
	if *opsSteps > 0 {
		steps = *opsSteps
	}
	if *opsSeed != 0 {
		seed = *opsSeed
	}
	r := &opsRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed,
		apps: map[string]*modelApp{}, removed: map[string]int{}, gone: map[string]*modelApp{}, names: []string{"web", "api", "jobs", "rel"}}
	r.apps["web"] = &modelApp{port: FreePort(t), instances: 2, version: r.version()}
	r.a = StartAgent(t, bins, r.config())
	r.a.CallTimeout = 90 * time.Second
	t.Logf("seed %d, %d steps (replay: go test ./integration -run TestRandomOperations -ops.seed=%d -ops.steps=%d)", seed, steps, seed, steps)
	r.check()
	for r.step = 1; r.step <= steps; r.step++ {
		r.do()
		r.check()
	}
	r.shutdown()
}

// version returns a new version name.
func (r *opsRun) version() string {
	r.nextVer++
	return "v" + strconv.Itoa(r.nextVer)
}

// config is the config file of the model's apps.
func (r *opsRun) config() string {
	var b strings.Builder
	for _, n := range sortedKeys(r.apps) {
		m := r.apps[n]
		if m.releases {
			fmt.Fprintf(&b, "[apps.%s]\ncommand = [\"./run\"]\nreleases = true\nkeep_releases = 3\ninstances = %d\n"+
				"listen = [\"tcp://127.0.0.1:%d\"]\nready_timeout = \"10s\"\nstop_timeout = \"10s\"\n\n", n, m.instances, m.port)
			continue
		}
		b.WriteString(appConfig(n, m.port, m.instances, fmt.Sprintf("env = { TESTAPP_VERSION = %q }\n", m.version)))
	}
	return b.String()
}

// fail stops the run with the steps so far and the seed to replay them.
func (r *opsRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("step %d: %s\nseed %d; steps:\n  %s\nagent log:\n%s", r.step, fmt.Sprintf(format, args...), r.seed,
		strings.Join(r.log, "\n  "), r.a.Log())
}

// cli runs one CLI command that must succeed.
func (r *opsRun) cli(args ...string) {
	r.t.Helper()
	if res := r.a.CLI(args...); res.Code != 0 {
		r.fail("deployd %s: exit %d\n%s%s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
	}
}

// refused runs one CLI command that must be refused (exit 1) saying want,
// and change nothing.
func (r *opsRun) refused(want string, args ...string) {
	r.t.Helper()
	res := r.a.CLI(args...)
	if res.Code != 1 || !strings.Contains(res.Stderr, want) {
		r.fail("deployd %s: exit %d, want 1 saying %q\n%s%s", strings.Join(args, " "), res.Code, want, res.Stdout, res.Stderr)
	}
}

// pick returns a random running (in the config) app, "" when there is none.
func (r *opsRun) pick() string {
	names := sortedKeys(r.apps)
	if len(names) == 0 {
		return ""
	}
	return names[r.rng.IntN(len(names))]
}

// do runs one random operation and updates the model.
func (r *opsRun) do() {
	r.t.Helper()
	name := r.pick()
	op := r.rng.IntN(12)
	if name == "" {
		op = 0
	}
	if m := r.apps[name]; m != nil && m.releases && m.version == "" && op >= 2 && op != 10 {
		op = 10 // an app without a release can only be deployed to
	}
	desc := ""
	switch op {
	case 0: // add an app through a reload of every app
		var free []string
		for _, n := range r.names {
			if r.apps[n] == nil {
				free = append(free, n)
			}
		}
		if len(free) == 0 {
			r.do()
			return
		}
		n := free[r.rng.IntN(len(free))]
		port, ok := r.removed[n]
		if !ok {
			port = FreePort(r.t)
		}
		delete(r.removed, n)
		r.apps[n] = &modelApp{port: port, instances: 1 + r.rng.IntN(2), version: r.version()}
		if n == "rel" { // takes releases: none until the first deploy
			r.apps[n].version, r.apps[n].releases = "", true
			if g := r.gone[n]; g != nil { // its releases stayed on disk and in state.json
				r.apps[n].version, r.apps[n].previous, r.apps[n].installed = g.version, g.previous, g.installed
			}
		}
		desc = fmt.Sprintf("add %s (%d workers) by a reload", n, r.apps[n].instances)
		r.logStep(desc)
		r.a.WriteConfig(r.config())
		r.cli("reload")
	case 1: // remove an app through a reload of every app
		if len(r.apps) == 1 {
			r.do()
			return
		}
		r.logStep("remove " + name + " by a reload")
		r.removed[name] = r.apps[name].port
		r.gone[name] = r.apps[name]
		delete(r.apps, name)
		r.a.WriteConfig(r.config())
		r.cli("reload")
	case 2: // a new version of one app, reloaded by name
		m := r.apps[name]
		if m.releases {
			r.deploy(name)
			return
		}
		m.version = r.version()
		r.logStep(fmt.Sprintf("reload %s to %s", name, m.version))
		r.a.WriteConfig(r.config())
		r.cli("reload", name) // a stopped app stays stopped, on the new version
	case 3: // scale
		m := r.apps[name]
		n := 1 + r.rng.IntN(3)
		r.logStep(fmt.Sprintf("scale %s %d", name, n))
		r.cli("scale", name, strconv.Itoa(n))
		m.scaled, m.stopped = n, false // scale starts a stopped app
	case 4: // stop
		r.logStep("stop " + name)
		r.cli("stop", name)
		r.apps[name].stopped = true
	case 5: // start
		r.logStep("start " + name)
		r.cli("start", name)
		r.apps[name].stopped = false
	case 6: // restart
		r.logStep("restart " + name)
		r.cli("restart", name) // restart starts a stopped app
		r.apps[name].stopped = false
	case 7: // SIGKILL one worker; the supervisor replaces it
		st := r.a.Status()
		ws := appOf(st, name).Workers
		if len(ws) == 0 {
			r.logStep("kill a worker of " + name + " (none runs)")
			return
		}
		w := ws[r.rng.IntN(len(ws))]
		r.logStep(fmt.Sprintf("SIGKILL %s[%d] pid %d", name, w.Slot, w.PID))
		if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
			r.fail("kill %d: %v", w.PID, err)
		}
		r.a.WaitFor(fmt.Sprintf("%s[%d] replaced", name, w.Slot), 30*time.Second, func(st *api.Status) bool {
			for _, x := range appOf(st, name).Workers {
				if x.Slot == w.Slot && x.PID != w.PID && x.State == "ready" {
					return true
				}
			}
			return false
		})
	case 9: // a canary of one worker, then promote or abort
		r.canary(name)
	case 10: // deploy a new release to the app that takes releases
		if r.apps["rel"] == nil {
			r.do()
			return
		}
		r.deploy("rel")
	case 11: // roll back (to the previous release, or --to an installed one)
		if m := r.apps["rel"]; m == nil || m.previous == "" {
			r.do()
			return
		}
		r.rollback("rel")
	case 8: // agent upgrade by SIGHUP: the workers are adopted, same pids
		before := allWorkerPIDs(r.a.Status())
		old, _ := agentPID(r.t, r.a)
		r.logStep(fmt.Sprintf("SIGHUP agent %d", old))
		if err := syscall.Kill(old, syscall.SIGHUP); err != nil {
			r.fail("SIGHUP %d: %v", old, err)
		}
		r.a.WaitFor("a new agent", 60*time.Second, func(st *api.Status) bool { return st.Agent.PID != old })
		after := allWorkerPIDs(r.a.Status())
		for pid := range before {
			if !after[pid] {
				r.fail("worker %d was not adopted by the upgraded agent (before %v, after %v)", pid, before, after)
			}
		}
	}
}

// deploy installs and rolls out a new release of a releases app.
func (r *opsRun) deploy(name string) {
	r.t.Helper()
	m := r.apps[name]
	ver := "1." + strconv.Itoa(r.nextVer) + ".0"
	r.nextVer++
	args := []string{"deploy", name, "--artifact", artifactDir(r.t, ver, false), "--version", ver}
	if m.stopped {
		r.logStep(fmt.Sprintf("deploy %s %s (stopped: refused)", name, ver))
		r.refused("is stopped", args...)
		return
	}
	r.logStep(fmt.Sprintf("deploy %s %s", name, ver))
	r.cli(args...)
	if m.version != "" {
		m.previous = m.version
	}
	m.version = ver
	m.installed = append(m.installed, ver)
	if len(m.installed) > 3 { // keep_releases = 3
		m.installed = m.installed[len(m.installed)-3:]
	}
}

// rollback rolls a releases app back to its previous release, or to
// another installed one with --to.
func (r *opsRun) rollback(name string) {
	r.t.Helper()
	m := r.apps[name]
	to := m.previous
	args := []string{"rollback", name}
	if r.rng.IntN(2) == 0 {
		var others []string
		for _, v := range m.installed {
			if v != m.version {
				others = append(others, v)
			}
		}
		to = others[r.rng.IntN(len(others))]
		args = append(args, "--to", to)
	}
	if m.stopped {
		r.logStep(strings.Join(args, " ") + " (stopped: refused)")
		r.refused("is stopped", args...)
		return
	}
	r.logStep(fmt.Sprintf("%s (to %s)", strings.Join(args, " "), to))
	r.cli(args...)
	m.previous, m.version = m.version, to
}

// canary reloads one worker of a config app to a new version, holds it,
// checks that the pool serves both, then promotes or aborts.
func (r *opsRun) canary(name string) {
	r.t.Helper()
	m := r.apps[name]
	if m.releases || m.want() < 2 {
		r.logStep("canary of " + name + " (skipped: fewer than 2 workers)")
		return
	}
	old, next := m.version, r.version()
	m.version = next
	r.a.WriteConfig(r.config())
	r.logStep(fmt.Sprintf("reload %s --canary 1 (%s -> %s)", name, old, next))
	r.cli("reload", name, "--canary", "1")
	if st := r.a.App(name); st.State != "canary" {
		r.fail("%s after reload --canary 1: state %q, want canary", name, st.State)
	}
	seen := map[string]bool{}
	for i := 0; i < 40*m.want() && len(seen) < 2; i++ {
		body, err := get(r.t, m.port, "/")
		if err != nil {
			r.fail("%s during the canary: GET /: %v", name, err)
		}
		var ver string
		fmt.Sscanf(body, "version=%s", &ver)
		seen[ver] = true
	}
	if !seen[old] || !seen[next] || len(seen) != 2 {
		r.fail("%s during the canary serves %v, want %s and %s", name, seen, old, next)
	}
	if r.rng.IntN(2) == 0 {
		r.logStep("promote " + name)
		r.cli("promote", name)
		return
	}
	r.logStep("abort " + name)
	r.cli("abort", name)
	m.version = old
	r.a.WriteConfig(r.config()) // the file says what runs again
}

func (r *opsRun) logStep(s string) {
	r.log = append(r.log, fmt.Sprintf("%d: %s", r.step, s))
	r.t.Logf("step %d: %s", r.step, s)
}

// check holds the agent against the model: the apps and their workers in
// status, the version each app serves, closed ports of removed apps, the
// processes of the test's folder, and state.json.
func (r *opsRun) check() {
	r.t.Helper()
	last := ""
	defer func() {
		if r.t.Failed() && last != "" {
			r.t.Logf("last difference from the model: %s", last)
		}
	}()
	st := r.a.WaitFor("the model's pools", 30*time.Second, func(st *api.Status) bool {
		last = r.poolsDiffer(st)
		return last == ""
	})
	for _, n := range sortedKeys(r.apps) {
		m := r.apps[n]
		if m.want() == 0 {
			continue
		}
		pids := PIDs(appOf(st, n))
		for i := 0; i < 4*m.want(); i++ {
			body, err := get(r.t, m.port, "/")
			if err != nil {
				r.fail("%s: GET /: %v", n, err)
			}
			var ver string
			var pid, slot int
			if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &pid, &slot); err != nil {
				r.fail("%s: body %q", n, body)
			}
			if ver != m.version {
				r.fail("%s serves %s, the model says %s", n, ver, m.version)
			}
			if pids[slot] != pid {
				r.fail("%s: pid %d answered as slot %d; status lists %v", n, pid, slot, pids)
			}
		}
	}
	for n, port := range r.removed {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			r.fail("port %d of removed app %s still accepts", port, n)
		}
	}
	listed := allWorkerPIDs(st)
	for _, ap := range st.Apps { // old workers still draining are the agent's too
		for _, w := range ap.Draining {
			listed[w.PID] = true
		}
	}
	r.checkProcesses(listed)
	r.checkState()
}

// poolsDiffer says how status differs from the model ("" when it does not).
func (r *opsRun) poolsDiffer(st *api.Status) string {
	var names []string
	for _, ap := range st.Apps {
		names = append(names, ap.Name)
	}
	sort.Strings(names)
	if want := sortedKeys(r.apps); !slices.Equal(names, want) {
		return fmt.Sprintf("apps %v, want %v", names, want)
	}
	for n, m := range r.apps {
		ap := appOf(st, n)
		if m.want() == 0 {
			if len(ap.Workers) != 0 {
				return fmt.Sprintf("%s is stopped but has workers %+v", n, ap.Workers)
			}
			continue
		}
		if !AllReady(st, n, m.want()) {
			return fmt.Sprintf("%s: want %d ready workers, have %+v", n, m.want(), ap.Workers)
		}
	}
	return ""
}

// checkProcesses fails when a process of the test app runs in the agent's
// folder that status does not list (an orphan or a leftover).
func (r *opsRun) checkProcesses(listed map[int]bool) {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		extra := r.strays(listed)
		if len(extra) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.fail("processes of the test app run that status does not list: %v (listed %v)", extra, listed)
		}
		time.Sleep(50 * time.Millisecond) // a drained worker's exit is reaped asynchronously
	}
}

// strays are the test app's processes whose folder is the agent's and
// whose pid is not in listed.
func (r *opsRun) strays(listed map[int]bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || listed[pid] || !Alive(pid) {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != bins.TestApp {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == r.a.Dir {
			out = append(out, pid)
		}
	}
	return out
}

// checkState holds state.json against the model: stopped flags and scaled
// counts of the apps in the config.
func (r *opsRun) checkState() {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.a.Dir, "state", "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		b = []byte("{}") // nothing recorded yet
	} else if err != nil {
		r.fail("state.json: %v", err)
	}
	var doc struct {
		Apps map[string]struct {
			Instances int    `json:"instances"`
			Stopped   bool   `json:"stopped"`
			Current   string `json:"current"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		r.fail("state.json: %v\n%s", err, b)
	}
	for n, m := range r.apps {
		s := doc.Apps[n]
		if m.releases && s.Current != m.version {
			r.fail("state.json for %s: current release %q, the model says %q\n%s", n, s.Current, m.version, b)
		}
		if s.Stopped != m.stopped || s.Instances != m.scaled {
			r.fail("state.json for %s: stopped %v, instances %d; the model says stopped %v, scaled %d\n%s",
				n, s.Stopped, s.Instances, m.stopped, m.scaled, b)
		}
	}
}

// shutdown stops the agent with `deployd shutdown`: every worker and every
// port is gone after it.
func (r *opsRun) shutdown() {
	r.t.Helper()
	st := r.a.Status()
	pids := allWorkerPIDs(st)
	r.step++
	r.logStep("shutdown")
	r.cli("shutdown")
	waitAllGone(r.t, pids, 30*time.Second)
	if extra := r.strays(nil); len(extra) > 0 {
		r.fail("processes of the test app left after shutdown: %v", extra)
	}
	for n, m := range r.apps {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", m.port), time.Second); err == nil {
			c.Close()
			r.fail("port %d of %s still accepts after shutdown", m.port, n)
		}
	}
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
