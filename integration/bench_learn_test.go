package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// slowStartApp listens on port after a start-up of 1.5 s, as an app that
// loads much before it serves.
const slowStartApp = `setTimeout(() => {
  require('http').createServer((q, r) => r.end('ok\n')).listen(%d, '127.0.0.1');
}, 1500);
`

// BenchmarkNodeReloadLearnedVsListen: a rolling reload of 2 workers of a
// Node.js app that starts in 1.5 s, with its listen list and without one
// (its port learned from its own bind), the two agents' reloads taken in
// turn in one run. ratio is the one without over the one with (1.00: the
// same cost; a run of the app only to learn its port made it 1.34).
//
//	go test ./integration -run '^$' -bench NodeReloadLearnedVsListen -benchtime 5x
func BenchmarkNodeReloadLearnedVsListen(b *testing.B) {
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("node not installed")
	}
	start := func(listen bool) (*Agent, string) {
		port := FreePort(b)
		dir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "app.js"), []byte(fmt.Sprintf(slowStartApp, port)), 0o644); err != nil {
			b.Fatal(err)
		}
		cfg := fmt.Sprintf("[apps.web]\ncommand = [%q, \"app.js\"]\ncwd = %q\ninstances = 2\nready_timeout = \"30s\"\nstop_timeout = \"5s\"\n", node, dir)
		if listen {
			cfg += fmt.Sprintf("listen = [\"tcp://127.0.0.1:%d\"]\n", port)
		}
		a := StartAgent(b, bins, cfg)
		a.WaitFor("ready", time.Minute, func(st *api.Status) bool { return AllReady(st, "web", 2) })
		return a, dir
	}
	with, _ := start(true)
	without, _ := start(false)
	reload := func(a *Agent) time.Duration {
		t0 := time.Now()
		if r := a.CLIWithin(2*time.Minute, "reload", "web"); r.Code != 0 {
			b.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
		}
		return time.Since(t0)
	}
	var tw, tn time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tw += reload(with)
		tn += reload(without)
	}
	b.ReportMetric(tw.Seconds()/float64(b.N), "s-reload-listen")
	b.ReportMetric(tn.Seconds()/float64(b.N), "s-reload-learned")
	b.ReportMetric(tn.Seconds()/tw.Seconds(), "ratio")
}
