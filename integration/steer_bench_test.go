package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// pidApp is a plain Node.js server that answers with its pid.
const pidApp = `const http = require('http');
http.createServer((req, res) => { res.end('pid=' + process.pid); }).listen(3000);
`

// TestBalanceBench measures each worker's share of the requests of 8
// workers of a Node.js app with balance = "shared" and "even", under a
// keep-alive and a new-connection load at once (8 clients each, 10 s), and
// prints a Markdown table (BENCHMARKS.md "Balance").
//
//	DEPLOYD_BALANCE_BENCH=1 go test -run TestBalanceBench -v ./integration
func TestBalanceBench(t *testing.T) {
	if os.Getenv("DEPLOYD_BALANCE_BENCH") == "" {
		t.Skip("a benchmark: set DEPLOYD_BALANCE_BENCH=1 to run it")
	}
	needSteering(t)
	const workers = 8
	modes := []string{"shared", "even"}
	shares := map[string][2][]float64{} // mode → keep-alive, new-connection shares, descending
	var notes []string
	for _, mode := range modes {
		port := FreePort(t)
		dir := nodeApp(t, "express4", port, map[string]string{"app.js": pidApp})
		a := StartAgent(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, workers, fmt.Sprintf("balance = %q", mode)))
		a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", workers) })
		var res [2]loadgen.Result
		var by [2]map[string]int
		var wg sync.WaitGroup
		for i, ka := range []bool{true, false} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], by[i] = pidLoad(t, port, ka)
			}()
		}
		wg.Wait()
		a.Stop()
		var s [2][]float64
		for i := range 2 {
			requireNoFailures(t, mode, res[i])
			s[i] = sharesOf(by[i], workers)
		}
		shares[mode] = s
		notes = append(notes, fmt.Sprintf("%s: keep-alive %d requests (%.0f rps), new-connection %d (%.0f rps)", mode,
			res[0].Requests, res[0].RPS, res[1].Requests, res[1].RPS))
	}
	var rows []string
	for w := range workers {
		rows = append(rows, fmt.Sprintf("| %d | %.1f | %.1f | %.1f | %.1f |", w+1,
			shares["shared"][0][w], shares["even"][0][w], shares["shared"][1][w], shares["even"][1][w]))
	}
	spread := func(s []float64) string { return fmt.Sprintf("%.1f–%.1f", s[len(s)-1], s[0]) }
	rows = append(rows, fmt.Sprintf("| least–most | %s | %s | %s | %s |", spread(shares["shared"][0]),
		spread(shares["even"][0]), spread(shares["shared"][1]), spread(shares["even"][1])))
	t.Logf("\n| worker (by share) | shared, keep-alive %% | even, keep-alive %% | shared, new conn. %% | even, new conn. %% |\n|---|---|---|---|---|\n%s\n\n%s",
		strings.Join(rows, "\n"), strings.Join(notes, "\n"))
}

// pidLoad runs 8 clients for 10 s against port and counts the answers of
// each pid.
func pidLoad(t *testing.T, port int, keepAlive bool) (loadgen.Result, map[string]int) {
	var mu sync.Mutex
	by := map[string]int{}
	check := func(status int, body []byte) error {
		pid, ok := strings.CutPrefix(string(body), "pid=")
		if status != 200 || !ok {
			return fmt.Errorf("status %d body %q", status, body)
		}
		mu.Lock()
		by[pid]++
		mu.Unlock()
		return nil
	}
	r, err := loadgen.Run(context.Background(), loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/", port),
		Clients: 8, KeepAlive: keepAlive, MaxRequests: 2_000_000, MaxDuration: 10 * time.Second, Check: check})
	if err != nil {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return r, by
}

// sharesOf returns each of n workers' percentage of the answers, largest
// first (a worker that got none counts as 0).
func sharesOf(by map[string]int, n int) []float64 {
	total := 0
	var s []float64
	for _, c := range by {
		total += c
	}
	for _, c := range by {
		s = append(s, 100*float64(c)/float64(max(total, 1)))
	}
	for len(s) < n {
		s = append(s, 0)
	}
	slices.Sort(s)
	slices.Reverse(s)
	return s
}
