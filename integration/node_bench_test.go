package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// TestNodeBenchVersusPM2 runs the same unmodified Express apps under PM2
// cluster mode (pm2 start app.js -i 2; pm2 reload) and under deployd (2
// workers; deployd reload), one after the other in one run, each reloaded
// under a keep-alive and a new-connection load, and prints a Markdown table
// (BENCHMARKS.md "Unmodified Node.js apps"). pm2 comes from the npm registry
// into a temporary folder; PM2_HOME is temporary too.
//
//	DEPLOYD_NODE_BENCH=1 go test -run TestNodeBenchVersusPM2 -v ./integration
func TestNodeBenchVersusPM2(t *testing.T) {
	if os.Getenv("DEPLOYD_NODE_BENCH") == "" {
		t.Skip("a benchmark: set DEPLOYD_NODE_BENCH=1 to run it")
	}
	nodeFixtures(t)
	pm2 := installPM2(t)
	const reloads, runs = 5, 2
	apps := []struct{ name, express, file, body string }{
		{"tutorial app (Express 4, no shutdown handler)", "express4", "app.js", tutorialApp},
		{"`server.close(() => process.exit(0))` on SIGTERM (Express 5)", "express5", "app.js", closeHandlerApp},
	}
	var rows []string
	for _, app := range apps {
		for run := 1; run <= runs; run++ {
			for _, sys := range []string{"pm2", "deployd"} {
				port := FreePort(t)
				dir := nodeApp(t, app.express, port, map[string]string{app.file: app.body})
				var m benchRun
				if sys == "pm2" {
					m = pm2Reloads(t, pm2, dir, app.file, port, reloads)
				} else {
					m = deploydReloads(t, dir, app.file, port, reloads)
				}
				rows = append(rows, fmt.Sprintf("| %s | %d | %s | %d + %d | %.1f | %s | %s | %s |", app.name, run, sys,
					m.ka.Failures, m.nka.Failures, float64(m.ka.Failures+m.nka.Failures)/reloads,
					ms(m.ka.P99), ms(m.nka.P99), secs(m.reloads)))
			}
		}
	}
	t.Logf("\n| app | run | system | failed (keep-alive + new conn.) | failed per reload | p99 ms keep-alive | p99 ms new conn. | reload s (each) |\n|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

type benchRun struct {
	ka, nka loadgen.Result
	reloads []time.Duration
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }

func secs(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
	}
	return strings.Join(s, " ")
}

func installPM2(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dir, "pm2@5")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install pm2: %v\n%s", err, out)
	}
	return filepath.Join(dir, "node_modules", ".bin", "pm2")
}

func pm2Reloads(t *testing.T, pm2, dir, file string, port, reloads int) benchRun {
	t.Helper()
	home := t.TempDir()
	// Without PM2_HOME/touch the first command reports an install to version.pm2.io.
	os.WriteFile(filepath.Join(home, "touch"), []byte(strconv.FormatInt(time.Now().UnixMilli(), 10)), 0o644)
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, pm2, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PM2_HOME="+home, "PM2_DISABLE_VERSION_CHECK=true")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pm2 %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() {
		cmd := exec.Command(pm2, "kill")
		cmd.Env = append(os.Environ(), "PM2_HOME="+home, "PM2_DISABLE_VERSION_CHECK=true")
		cmd.Run()
	})
	run("start", file, "-i", "2", "--name", "web")
	waitServing(t, port)
	stop := helloLoad(t, port, 20, 3*time.Minute)
	var m benchRun
	for i := 0; i < reloads; i++ {
		t0 := time.Now()
		run("reload", "web")
		m.reloads = append(m.reloads, time.Since(t0))
	}
	m.ka, m.nka = stop()
	return m
}

func deploydReloads(t *testing.T, dir, file string, port, reloads int) benchRun {
	t.Helper()
	a := StartAgent(t, bins, nodeConfig(dir, []string{"node", file}, port, 2, ""))
	a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := helloLoad(t, port, 20, 3*time.Minute)
	var m benchRun
	for i := 0; i < reloads; i++ {
		t0 := time.Now()
		if r := a.CLI("reload", "web"); r.Code != 0 {
			t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
		}
		m.reloads = append(m.reloads, time.Since(t0))
	}
	m.ka, m.nka = stop()
	a.Stop()
	return m
}

func waitServing(t *testing.T, port int) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing serves port %d after 30s", port)
}
