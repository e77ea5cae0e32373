package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// Benchmarks of the core paths, run with
//
//	go test ./integration -run '^$' -bench . -benchtime 10x
//
// They report the figures the issues ask for as custom metrics.

// BenchmarkAgentStartToReady: `deployd agent` started to every worker ready
// (2 workers of the Go test app).
func BenchmarkAgentStartToReady(b *testing.B) {
	port := FreePort(b)
	for i := 0; i < b.N; i++ {
		a := NewAgentDir(b, bins, appConfig("web", port, 2, ""))
		t0 := time.Now()
		a.Start()
		a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
		b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "ms-to-ready")
		a.Stop()
	}
}

// BenchmarkCrashToReplacementReady: SIGKILL of a worker to its replacement
// ready (stable_after is short so that every kill is an isolated crash,
// restarted at once; a kill sooner after ready meets the crash-loop backoff).
func BenchmarkCrashToReplacementReady(b *testing.B) {
	port := FreePort(b)
	a := StartAgent(b, bins, appConfig("web", port, 2, "[apps.web.restart]\nmax_restarts = 100000\nstable_after = \"100ms\""))
	a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	var total time.Duration
	for i := 0; i < b.N; i++ {
		old := PIDs(a.App("web"))[0]
		t0 := time.Now()
		syscall.Kill(old, syscall.SIGKILL)
		a.WaitFor("replacement", 30*time.Second, func(st *api.Status) bool {
			return AllReady(st, "web", 2) && PIDs(appOf(st, "web"))[0] != old
		})
		total += time.Since(t0)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-kill-to-ready")
}

// BenchmarkAgentRSS reports the agent's resident memory with 2 workers, and
// the time of a rolling reload of both.
func BenchmarkAgentRSS(b *testing.B) {
	port := FreePort(b)
	a := StartAgent(b, bins, appConfig("web", port, 2, ""))
	a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	var reload time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if r := a.CLI("reload", "web"); r.Code != 0 {
			b.Fatalf("reload: %s", r.Stderr)
		}
		reload += time.Since(t0)
	}
	b.ReportMetric(float64(reload.Microseconds())/1000/float64(b.N), "ms-per-reload")
	b.ReportMetric(float64(vmRSS(b, a.Status().Agent.PID))/(1<<20), "agent-MiB-RSS")
}

// vmRSS reads VmRSS of pid in bytes.
func vmRSS(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
