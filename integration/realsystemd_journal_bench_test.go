package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// BenchmarkJournalVsFiles (one run: -benchtime=1x) measures, under a real
// systemd, 2 workers printing 100 000 numbered lines each as fast as they
// can with target = "files", "journal" and "both": lines per second until
// the last line is in its log (files), in journalctl (journal), or in both,
// and the agent's CPU per 100 000 lines. journald's rate limit is lifted,
// as docs/logs.md says.
func BenchmarkJournalVsFiles(b *testing.B) {
	for _, target := range []string{"files", "journal", "both"} {
		b.Run(target, func(b *testing.B) {
			for b.Loop() {
				benchTarget(b, target)
			}
		})
	}
}

func benchTarget(b *testing.B, target string) {
	const workers, perWorker = 2, 100_000
	port := FreePort(b)
	a := NewAgentDir(b, bins, appConfig("web", port, workers, fmt.Sprintf(`ready_timeout = "60s"
env = { TESTAPP_LOG_SPAM = "%d", TESTAPP_READY_FILE = "%%DIR%%/go" }
[apps.web.logs]
target = %q
max_size = "1GiB"
`, perWorker, target)))
	sd := bootSystemd(b, a.Dir, bins.Dir)
	if out, err := sd.run("sh", "-c", "mkdir -p /etc/systemd/journald.conf.d && "+
		"printf '[Journal]\\nRateLimitIntervalSec=0\\n' > /etc/systemd/journald.conf.d/deployd.conf && "+
		"systemctl restart systemd-journald"); err != nil {
		b.Fatalf("lift journald's rate limit: %v\n%s", err, out)
	}
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config); err != nil {
		b.Fatalf("deployd startup systemd: %v\n%s", err, out)
	}
	sd.mustCtl("daemon-reload")
	sd.mustCtl("start", "deployd")
	// The workers wait for a file before they get ready and print: the
	// clock and the agent's CPU start once they run, not when a poll of
	// the status sees them ready (by then a fast target had most of the
	// lines: 0 ms of CPU per 100 000 lines for files in one run).
	st := a.WaitFor("the workers started", 30*time.Second, func(st *api.Status) bool { return len(appOf(st, "web").Workers) == workers })
	t0 := time.Now()
	agent := sd.hostPID(st.Agent.PID)
	cpu0 := procCPU(b, agent)
	if err := os.WriteFile(filepath.Join(a.Dir, "go"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	st = a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", workers) })
	var c *spamCount
	for deadline := t0.Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if target != "journal" && (c == nil || !c.complete(workers)) {
			c = newSpamCount("line", perWorker)
			c.read(b, logFilesOf(b, filepath.Join(a.Dir, "logs"), "web.out"))
			if !c.complete(workers) && time.Now().Before(deadline) {
				continue
			}
		}
		if target != "files" {
			// Cheap while it runs (journalctl reading every entry would
			// take the CPU being measured): the newest line of each
			// worker; lines of a worker land in order.
			if journalDone(sd, st, perWorker) || time.Now().After(deadline) {
				took, cpu := time.Since(t0), procCPU(b, agent)-cpu0
				j, _ := countJournal(b, sd)
				report(b, j, workers, perWorker, took, cpu)
				if c != nil && !c.complete(workers) {
					b.Fatalf("%d of %d lines in the files within 3 minutes", c.total, workers*perWorker)
				}
				return
			}
			continue
		}
		break
	}
	report(b, c, workers, perWorker, time.Since(t0), procCPU(b, agent)-cpu0)
}

// journalDone reports whether the newest entry of each worker of st's web
// is its last line.
func journalDone(sd *realSystemd, st *api.Status, perWorker int) bool {
	for _, w := range appOf(st, "web").Workers {
		out, _ := sd.run("journalctl", "--no-pager", "-q", "-n", "1", "-o", "cat", fmt.Sprintf("DEPLOYD_PID=%d", w.PID))
		if !strings.HasSuffix(strings.TrimSpace(out), fmt.Sprintf(" %d", perWorker)) {
			return false
		}
	}
	return true
}

func report(b *testing.B, c *spamCount, workers, perWorker int, took, cpu time.Duration) {
	if !c.complete(workers) {
		b.Fatalf("%d of %d lines within 3 minutes", c.total, workers*perWorker)
	}
	b.ReportMetric(float64(workers*perWorker)/took.Seconds(), "lines/s")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(workers*perWorker/100_000), "agent-cpu-ms/100k-lines")
}
