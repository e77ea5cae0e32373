package integration

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// TestSelfBindBench compares, in one run, 2 self-binding Go workers
// (integration/selfbind: ListenAndServe(":PORT"), its bind answered with
// the agent's socket, the seccomp filter on every call it makes) with 2
// workers of the same handler given fd 3 through package worker
// (integration/goapp, bind = "inherit": no filter): requests per second
// and the workers' CPU per request under a keep-alive and a
// new-connection load at once, rounds alternating between the two so the
// machine's other load falls on both. The bind costs nothing on the data
// path: each figure within 3% (docs/compatibility.md).
//
//	DEPLOYD_SELFBIND_BENCH=1 go test -run TestSelfBindBench -v ./integration
func TestSelfBindBench(t *testing.T) {
	if os.Getenv("DEPLOYD_SELFBIND_BENCH") == "" {
		t.Skip("a benchmark: set DEPLOYD_SELFBIND_BENCH=1 to run it")
	}
	const instances, rounds, round = 2, 4, 6 * time.Second
	selfPort, fdPort := FreePort(t), FreePort(t)
	self := StartAgent(t, bins, selfBindApp(selfBinders[0].argv(t, selfPort), selfPort, instances, "v1", ""))
	fd := StartAgent(t, bins, goAppConfig(goApp(t), fdPort, instances, "v1", `bind = "inherit"`))
	ports := map[string]int{"self-binding": selfPort, "fd 3": fdPort}
	agents := map[string]*Agent{"self-binding": self, "fd 3": fd}
	pids := map[string]map[int]int{}
	for name, a := range agents {
		st := a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
		pids[name] = PIDs(appOf(st, "web"))
	}
	type total struct {
		requests  int64
		cpu, wall time.Duration
	}
	sums := map[string]*total{"self-binding": {}, "fd 3": {}}
	for r := range rounds * 2 {
		name := []string{"self-binding", "fd 3"}[r%2]
		cpu0 := workersCPU(t, pids[name])
		res := benchLoad(t, ports[name], round)
		s := sums[name]
		s.cpu += workersCPU(t, pids[name]) - cpu0
		for _, x := range res {
			requireNoFailures(t, name, x)
			s.requests += x.Requests
		}
		s.wall += round
	}
	rps := func(n string) float64 { return float64(sums[n].requests) / sums[n].wall.Seconds() }
	cpuPer := func(n string) float64 { return float64(sums[n].cpu.Microseconds()) / float64(sums[n].requests) }
	t.Logf("\n| workers | requests/s | worker CPU µs per request |\n|---|---|---|\n| 2 given fd 3 (package worker) | %.0f | %.1f |\n| 2 self-binding (bind answered) | %.0f | %.1f |\n| self-binding / fd 3 | %.3f | %.3f |",
		rps("fd 3"), cpuPer("fd 3"), rps("self-binding"), cpuPer("self-binding"),
		rps("self-binding")/rps("fd 3"), cpuPer("self-binding")/cpuPer("fd 3"))
	if q := rps("self-binding") / rps("fd 3"); q < 0.97 {
		t.Errorf("self-binding workers serve %.1f%% fewer requests per second", (1-q)*100)
	}
	if q := cpuPer("self-binding") / cpuPer("fd 3"); q > 1.03 {
		t.Errorf("self-binding workers take %.1f%% more CPU per request", (q-1)*100)
	}
}

// benchLoad runs 4 keep-alive and 4 new-connection clients against port
// for d.
func benchLoad(t *testing.T, port int, d time.Duration) [2]loadgen.Result {
	t.Helper()
	var out [2]loadgen.Result
	var wg sync.WaitGroup
	for i, ka := range []bool{true, false} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := loadgen.Run(context.Background(), loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/", port),
				Clients: 4, KeepAlive: ka, MaxRequests: 50_000_000, MaxDuration: d})
			if err != nil {
				t.Error(err)
			}
			out[i] = r
		}()
	}
	wg.Wait()
	return out
}

// workersCPU is the CPU time the pids (slot → pid) have used.
func workersCPU(t *testing.T, pids map[int]int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		sum += procCPU(t, pid)
	}
	return sum
}
