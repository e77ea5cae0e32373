package integration

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// notifySocketOf reads NOTIFY_SOCKET from pid's environment.
func notifySocketOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("NOTIFY_SOCKET=")); ok {
			return string(v)
		}
	}
	t.Fatalf("worker %d has no NOTIFY_SOCKET", pid)
	return ""
}

// notifyFrom makes one worker send state on its NOTIFY_SOCKET (testapp
// /notify) and returns its pid.
func notifyFrom(t *testing.T, port int, state string) int {
	t.Helper()
	body, err := get(t, port, "/notify?state="+url.QueryEscape(state))
	if err != nil {
		t.Fatalf("notify %q: %v %s", state, err, body)
	}
	i := strings.Index(body, "pid=")
	if i < 0 {
		t.Fatalf("notify %q: answer %q names no pid", state, body)
	}
	pid, err := strconv.Atoi(strings.Fields(body[i+4:])[0])
	if err != nil {
		t.Fatalf("notify %q: answer %q: %v", state, body, err)
	}
	return pid
}

func workerOf(st *api.Status, app string, pid int) (api.Worker, bool) {
	for _, w := range appOf(st, app).Workers {
		if w.PID == pid {
			return w, true
		}
	}
	return api.Worker{}, false
}

// TestAdoptedWorkersKeepNotifyAndWatchdog: after an upgrade, adopted
// workers' NOTIFY_SOCKET (a path in state_dir) still reaches the agent —
// STATUS=, WATCHDOG=1 and STOPPING=1 — and status and metrics carry their
// counters, CPU and RSS; an adopted worker that stops pinging is replaced.
func TestAdoptedWorkersKeepNotifyAndWatchdog(t *testing.T) {
	parallel(t)
	mport, port := FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, fmt.Sprintf("metrics = \"127.0.0.1:%d\"\n\n", mport)+
		appConfig("web", port, 2, `watchdog = "1s"
stop_timeout = "1s"`))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	// One restart before the upgrade: its count must cross.
	if err := syscall.Kill(slotPIDs(st, "web")[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = a.WaitFor("slot 0 restarted", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 2) && appOf(st, "web").Restarts == 1
	})
	before := slotPIDs(st, "web")
	uptimes := map[int]float64{}
	for _, w := range appOf(st, "web").Workers {
		uptimes[w.Slot] = w.UptimeSeconds
	}
	socks := map[int]string{}
	for slot, pid := range before {
		socks[slot] = notifySocketOf(t, pid)
		if !strings.HasPrefix(socks[slot], filepath.Join(a.Dir, "state", "run", "notify")+"/") {
			t.Fatalf("worker %d: NOTIFY_SOCKET %q, want a path under state_dir/run/notify", pid, socks[slot])
		}
	}
	upgradeBy(t, a, "cli")
	st = a.WaitFor("ready after the upgrade", 10*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if got := slotPIDs(st, "web"); got[0] != before[0] || got[1] != before[1] {
		t.Fatalf("after the upgrade slots run %v, want the adopted %v", got, before)
	}
	for slot, p := range socks {
		if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("slot %d: notify socket %s after the upgrade: %v", slot, p, err)
		}
	}
	checkAdoptedStats(t, a, mport, before, uptimes)

	// STATUS= sent after the upgrade reaches the new agent.
	pid := notifyFrom(t, port, "STATUS=sent after the upgrade")
	a.WaitFor("STATUS= from the adopted worker", 5*time.Second, func(st *api.Status) bool {
		w, ok := workerOf(st, "web", pid)
		return ok && w.Status == "sent after the upgrade"
	})

	// WATCHDOG=1 pings reach the new agent: over three watchdog periods no
	// adopted worker is replaced (each would be after 1 s of silence).
	window := time.Now().Add(3 * time.Second)
	for time.Now().Before(window) {
		st = a.Status()
		for _, w := range appOf(st, "web").Workers {
			if w.WatchdogReplacements != 0 || w.PID != before[w.Slot] {
				t.Fatalf("adopted worker of slot %d replaced while it pinged: %+v\n%s", w.Slot, w, a.Log())
			}
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A hung adopted worker (SIGSTOP: no more pings) is replaced.
	if err := syscall.Kill(before[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The replacement counts once it is done: the new worker took the slot
	// and the hung one was told to stop (it never says it stopped
	// accepting, so that takes the bounded wait for it).
	st = a.WaitFor("hung adopted worker replaced", 30*time.Second, func(st *api.Status) bool {
		p := slotPIDs(st, "web")
		w, _ := workerOf(st, "web", p[1])
		return AllReady(st, "web", 2) && p[1] != before[1] && w.WatchdogReplacements > 0
	})
	for _, w := range appOf(st, "web").Workers {
		if want := map[int]int{0: 0, 1: 1}[w.Slot]; w.WatchdogReplacements != want {
			t.Errorf("slot %d: %d watchdog replacements, want %d (%+v)\nagent log:\n%s", w.Slot, w.WatchdogReplacements, want, w, a.Log())
		}
	}
	if p := slotPIDs(st, "web"); p[0] != before[0] {
		t.Errorf("the healthy adopted worker was replaced too: %v -> %v", before, p)
	}
	waitAllGone(t, map[int]bool{before[1]: true}, 10*time.Second)
	// Its notify socket goes with it; the other's stays.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Dir(socks[1])); os.IsNotExist(err) {
			break
		}
	}
	if _, err := os.Stat(filepath.Dir(socks[1])); !os.IsNotExist(err) {
		t.Errorf("the replaced adopted worker's notify folder %s is still there: %v", filepath.Dir(socks[1]), err)
	}
	if _, err := os.Stat(socks[0]); err != nil {
		t.Errorf("the kept worker's notify socket: %v", err)
	}

	// STOPPING=1 from an adopted worker shows in status.
	if pid = notifyFrom(t, port, "STOPPING=1"); pid != before[0] {
		// the new worker of slot 1 answered: not adopted, ask again
		for i := 0; i < 50 && pid != before[0]; i++ {
			pid = notifyFrom(t, port, "STOPPING=1")
		}
	}
	if pid != before[0] {
		t.Fatalf("the adopted worker %d never answered /notify", before[0])
	}
	a.WaitFor("STOPPING=1 from the adopted worker", 5*time.Second, func(st *api.Status) bool {
		w, ok := workerOf(st, "web", pid)
		return ok && w.State == "stopping"
	})
	t.Logf("adopted workers %v: STATUS=, WATCHDOG=1 and STOPPING=1 reached the new agent; hung worker %d replaced", before, before[1])
}

// checkAdoptedStats checks what status and metrics say of the adopted
// workers: their own start for uptime, the crossed restart count, RSS and
// CPU sampled by the new agent.
func checkAdoptedStats(t *testing.T, a *Agent, mport int, adopted map[int]int, uptimes map[int]float64) {
	t.Helper()
	st := a.WaitFor("RSS sampled", 5*time.Second, func(st *api.Status) bool {
		for _, w := range appOf(st, "web").Workers {
			if w.RSSBytes <= 0 {
				return false
			}
		}
		return len(appOf(st, "web").Workers) == 2
	})
	app := appOf(st, "web")
	if app.Restarts != 1 {
		t.Errorf("app restarts %d after the upgrade, want the 1 from before", app.Restarts)
	}
	for _, w := range app.Workers {
		if want := map[int]int{0: 1, 1: 0}[w.Slot]; w.Restarts != want {
			t.Errorf("slot %d: %d restarts after the upgrade, want %d", w.Slot, w.Restarts, want)
		}
		if w.UptimeSeconds <= uptimes[w.Slot] || w.CPUPercent < 0 {
			t.Errorf("slot %d: uptime %.2fs (%.2fs before the upgrade), cpu %.1f%%: want its own start and a sample",
				w.Slot, w.UptimeSeconds, uptimes[w.Slot], w.CPUPercent)
		}
	}
	// Prometheus counters count from the agent's own start, as any
	// process's do (rate() reads the drop as a reset); status keeps the
	// workers' restart counts (above).
	mfs := waitSample(t, mport, 0, "deployd_app_restarts_total", "app", "web")
	for _, pid := range adopted {
		p := strconv.Itoa(pid)
		if v := mustSample(t, mfs, "deployd_worker_resident_memory_bytes", "app", "web", "pid", p); v <= 0 {
			t.Errorf("metrics: adopted worker %s RSS %v", p, v)
		}
		mustSample(t, mfs, "deployd_worker_cpu_seconds_total", "app", "web", "pid", p)
		if v := mustSample(t, mfs, "deployd_worker_info", "app", "web", "pid", p, "state", "ready"); v != 1 {
			t.Errorf("metrics: adopted worker %s info %v", p, v)
		}
	}
}

// TestAdoptedWorkerOverMaxMemoryIsReplaced: an adopted worker that grows
// past max_memory is replaced as the agent's own would be, the new one
// ready first, under load, with no failed request.
func TestAdoptedWorkerOverMaxMemoryIsReplaced(t *testing.T) {
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, `max_memory = "150MiB"`))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := slotPIDs(st, "web")
	upgradeBy(t, a, "sighup")
	st = a.WaitFor("ready after the upgrade", 10*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if got := slotPIDs(st, "web"); got[0] != before[0] || got[1] != before[1] {
		t.Fatalf("after the upgrade slots run %v, want the adopted %v", got, before)
	}
	stop := startLoad(t, port, 20, time.Minute)
	// Ready workers are counted all along: never fewer than 2 (the new one
	// is ready before the big one is told to stop).
	var mu sync.Mutex
	minReady, polls := 2, 0
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := a.Ctx(0)
			st, err := a.Client.Status(ctx, "")
			cancel()
			if err != nil {
				continue
			}
			n := 0
			for _, w := range appOf(st, "web").Workers {
				if w.State == "ready" {
					n++
				}
			}
			mu.Lock()
			minReady, polls = min(minReady, n), polls+1
			mu.Unlock()
		}
	}()
	body, err := get(t, port, "/alloc?mb=200")
	if err != nil {
		t.Fatalf("alloc: %v %s", err, body)
	}
	st = a.WaitFor("the big adopted worker replaced", 30*time.Second, func(st *api.Status) bool {
		n := 0
		for _, w := range appOf(st, "web").Workers {
			n += w.MemoryReplacements
		}
		return n == 1 && AllReady(st, "web", 2)
	})
	close(quit)
	<-done
	ka, nka := stop()
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	after := slotPIDs(st, "web")
	var replaced []int
	for slot, pid := range before {
		if after[slot] != pid {
			replaced = append(replaced, pid)
		}
	}
	if len(replaced) != 1 {
		t.Fatalf("want exactly one adopted worker replaced: before %v after %v", before, after)
	}
	waitAllGone(t, map[int]bool{replaced[0]: true}, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if minReady < 2 || polls == 0 {
		t.Errorf("ready workers fell to %d during the replacement (%d polls): the new one must be ready first", minReady, polls)
	}
	t.Logf("adopted worker %d over max_memory replaced (ready workers never below %d in %d polls); load: keep-alive %s; new-connection %s",
		replaced[0], minReady, polls, ka, nka)
}
