package integration

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// abruptApp is the web app with a SIGTERM that cuts its connections, writing a
// numbered line every tick.
func abruptApp(port, instances int, extra string) string {
	return appConfig("web", port, instances, `env = { TESTAPP_ABRUPT_SIGTERM = "1", TESTAPP_TICK = "20ms" }
`+extra)
}

// upgradeBy runs one agent upgrade of kind "binary", "cli" or "sighup" and
// waits until another agent answers; it returns how long that took.
func upgradeBy(t *testing.T, a *Agent, kind string) time.Duration {
	t.Helper()
	old, _ := agentPID(t, a)
	t0 := time.Now()
	switch kind {
	case "binary":
		cand := filepath.Join(t.TempDir(), "deployd-new")
		CopyFile(t, bins.DeploydV2, cand)
		if r := a.CLI("upgrade", "--binary", cand); r.Code != 0 {
			t.Fatalf("upgrade --binary: exit %d\n%s\nagent log:\n%s", r.Code, r.Stderr, a.Log())
		}
	case "cli":
		if r := a.CLI("upgrade"); r.Code != 0 {
			t.Fatalf("upgrade: exit %d\n%s\nagent log:\n%s", r.Code, r.Stderr, a.Log())
		}
	case "sighup":
		if err := syscall.Kill(old, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pid, _ := agentPID(t, a); pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s upgrade: agent %d still answers after 30s\n%s", kind, old, a.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := time.Since(t0)
	// The old agent is gone soon after the new one answers (a next upgrade
	// waits for that): counted from then, not from t0, as a binary upgrade
	// first sends and checks the binary (9.5s once on a loaded machine).
	t1 := time.Now()
	for Alive(old) && time.Since(t1) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if Alive(old) {
		t.Fatalf("old agent %d still alive 10s after its successor answered (%s upgrade)\n%s", old, kind, a.Log())
	}
	return d
}

var tickRe = regexp.MustCompile(`tick (\d+) (\d+) (\d+)`)

// ticks counts every "tick slot pid n" line in the app's out logs: per pid,
// how many times each n appears.
func ticks(t *testing.T, dir string) map[int]map[int]int {
	t.Helper()
	out := map[int]map[int]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "logs", "web.out.log*"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			m := tickRe.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			pid, _ := strconv.Atoi(m[2])
			n, _ := strconv.Atoi(m[3])
			if out[pid] == nil {
				out[pid] = map[int]int{}
			}
			out[pid][n]++
		}
		fh.Close()
	}
	return out
}

// checkTicks fails unless every pid's numbers 1..max appear exactly once.
func checkTicks(t *testing.T, counts map[int]map[int]int, pids map[int]bool) {
	t.Helper()
	for pid := range pids {
		c := counts[pid]
		if len(c) == 0 {
			t.Errorf("worker %d: no tick line in the log", pid)
			continue
		}
		top := 0
		for n := range c {
			top = max(top, n)
		}
		var missing, dup []int
		for n := 1; n <= top; n++ {
			switch c[n] {
			case 0:
				missing = append(missing, n)
			case 1:
			default:
				dup = append(dup, n)
			}
		}
		if len(missing)+len(dup) > 0 {
			t.Errorf("worker %d: of ticks 1..%d, missing %v, repeated %v", pid, top, missing, dup)
		} else {
			t.Logf("worker %d: ticks 1..%d each exactly once", pid, top)
		}
	}
}

func TestUpgradesAdoptWorkersUnderLoad(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	const instances = 2
	a := NewAgentDir(t, bins, abruptApp(port, instances, ""))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := allWorkerPIDs(st)
	stop := startLoad(t, port, 50, 3*time.Minute)
	kinds := []string{"cli", "sighup", "binary"}
	var ds []time.Duration
	for i := 0; i < 12; i++ {
		kind := kinds[i%len(kinds)]
		d := upgradeBy(t, a, kind)
		ds = append(ds, d)
		st := a.WaitFor("web ready after the upgrade", 10*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
		if got := allWorkerPIDs(st); !samePIDs(got, before) {
			t.Fatalf("after upgrade %d (%s): worker pids %v, want the same as before %v\n%s", i+1, kind, keys(got), keys(before), a.Log())
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("12 upgrades (upgrade, SIGHUP, upgrade --binary): durations %v; median %v, max %v; worker pids unchanged %v",
		ds, sorted[len(sorted)/2], sorted[len(sorted)-1], keys(before))
	st = a.Status()
	for _, w := range appOf(st, "web").Workers {
		if w.UptimeSeconds < 1 {
			t.Errorf("worker %d: uptime %.1fs: status should count from its own start", w.PID, w.UptimeSeconds)
		}
	}
	// Every line the workers wrote is in the log once: stop the agent (and the
	// workers, which flush) first.
	a.Stop()
	checkTicks(t, ticks(t, a.Dir), before)
}

func samePIDs(a, b map[int]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for p := range a {
		if !b[p] {
			return false
		}
	}
	return true
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
