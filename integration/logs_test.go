package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestLogsEveryLineOnceAcrossRotations: 4 workers write 100 000 numbered
// lines each as fast as they can; with 1 MiB files that is more than 20
// rotations of web.out.log. Every line must be in the files exactly once, in
// each worker's order, and nothing dropped.
func TestLogsEveryLineOnceAcrossRotations(t *testing.T) {
	if RaceBuild() {
		// Its zero-drop assertion is about the agent's write throughput,
		// which the race detector cuts several times; the plain `go test
		// ./...` step of .ci/run checks it on the production build.
		t.Skip("DEPLOYD_TEST_RACE=1: a race-enabled agent is too slow for a throughput assertion")
	}
	const workers, perWorker = 4, 100_000
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, workers, fmt.Sprintf(`env = { TESTAPP_LOG_SPAM = "%d" }
[apps.web.logs]
max_size = "1MiB"
max_files = 1000
`, perWorker)))
	logDir := filepath.Join(a.Dir, "logs")
	t0 := time.Now()
	deadline := t0.Add(30 * time.Second)
	var c *spamCount
	for {
		c = newSpamCount("line", perWorker)
		c.read(t, logFilesOf(t, logDir, "web.out"))
		if c.complete(workers) || time.Now().After(deadline) {
			break
		}
		if appOf(a.Status(), "web").DroppedLogLines > 0 {
			// Those lines will never come: count what did.
			waitLogsSettled(t, logDir)
			c = newSpamCount("line", perWorker)
			c.read(t, logFilesOf(t, logDir, "web.out"))
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	st := a.Status()
	app := appOf(st, "web")
	t.Logf("%d lines of %d workers in %d files (%.1f MiB) after %s; restarts %d, dropped %d",
		workers*perWorker, len(c.seen), c.files, float64(c.bytes)/(1<<20), time.Since(t0).Round(time.Millisecond),
		app.Restarts, app.DroppedLogLines)
	if app.DroppedLogLines != 0 {
		t.Errorf("status reports %d dropped log lines, want 0 (the workers print faster than the agent "+
			"writes; a Sink that drops on a full queue loses the excess)", app.DroppedLogLines)
	}
	if len(c.bad) > 0 {
		t.Errorf("%d unexpected lines, e.g. %q", len(c.bad), c.bad[:min(len(c.bad), 3)])
	}
	if len(c.seen) != workers {
		t.Errorf("lines of %d pids, want %d (one per worker, no restart): %v", len(c.seen), workers, c.slots)
	}
	for pid := range c.seen {
		if m := c.missing(pid); m > 0 {
			t.Errorf("pid %d (slot %s): %d of %d lines missing", pid, c.slots[pid], m, perWorker)
		}
		if u, ok := c.unorder[pid]; ok {
			t.Errorf("pid %d: line %d follows line %d: out of order", pid, u[1], u[0])
		}
	}
	if len(c.extra) > 0 {
		t.Errorf("%d lines are in the logs more than once", len(c.extra))
	}
	if rotations := c.files - 1; rotations < 5 {
		t.Errorf("%d rotations, want at least 5", rotations)
	}
}

// TestLogsCrashingWorkerKeepsLastLines: a worker that prints a burst and
// dies at once (exit 3, or SIGKILL from itself) still has every line, the
// last one included, in the log; so does its stderr.
func TestLogsCrashingWorkerKeepsLastLines(t *testing.T) {
	parallel(t)
	script := `echo first-$$; i=0; while [ $i -lt 2000 ]; do echo spam-$$-$i; i=$((i+1)); done; ` +
		`echo last-words-$$; echo last-err-$$ >&2; ` +
		`if [ "$DEPLOYD_WORKER" = 0 ]; then exit 3; else kill -KILL $$; fi`
	a := StartAgent(t, bins, fmt.Sprintf(`[apps.crash]
command = ["/bin/sh", "-c", %q]
instances = 2
listen = ["tcp://127.0.0.1:%d"]
ready = "delay:10s"
[apps.crash.restart]
backoff = "10ms"
max_backoff = "20ms"
max_restarts = 3
window = "1m"
`, script, FreePort(t)))
	// The app errors when one slot has crashed too often; the other slot's
	// worker may still be writing its burst then. Read once every worker
	// has exited (its output is captured by then).
	a.WaitFor("app errored, every worker exited", 30*time.Second, func(st *api.Status) bool {
		app := appOf(st, "crash")
		if app.State != "errored" {
			return false
		}
		for _, w := range app.Workers {
			if w.State != "exited" {
				return false
			}
		}
		return true
	})

	out := a.CLI("logs", "crash", "--out", "-n", "100000")
	errs := a.CLI("logs", "crash", "--err", "-n", "1000")
	if out.Code != 0 || errs.Code != 0 {
		t.Fatalf("logs: exit %d, %d\n%s%s", out.Code, errs.Code, out.Stderr, errs.Stderr)
	}
	firsts := regexp.MustCompile(`\] first-(\d+)$`)
	var pids []string
	for _, l := range strings.Split(out.Stdout, "\n") {
		if m := firsts.FindStringSubmatch(l); m != nil {
			pids = append(pids, m[1])
		}
	}
	if len(pids) < 4 {
		t.Fatalf("want at least 4 runs of the crashing worker in the log, found %d:\n%s", len(pids), tailOf(out.Stdout, 20))
	}
	for _, pid := range pids {
		if n := strings.Count(out.Stdout, "] spam-"+pid+"-"); n != 2000 {
			t.Errorf("pid %s: %d of 2000 burst lines in the log", pid, n)
		}
		if !strings.Contains(out.Stdout, "] last-words-"+pid+"\n") {
			t.Errorf("pid %s: its last stdout line is not in the log", pid)
		}
		if !strings.Contains(errs.Stdout, "] last-err-"+pid+"\n") {
			t.Errorf("pid %s: its last stderr line is not in the err log:\n%s", pid, errs.Stdout)
		}
	}
	t.Logf("%d crashed runs, each with its 2002 stdout lines and its last stderr line", len(pids))
}

// TestLogsFollowAcrossRotationAndFlush runs `deployd logs web -f` while the
// app writes batches of lines between `deployd logs --rotate` and `--flush`:
// it must print every batch once. It also checks the plain tail and the
// rotate/flush results on disk.
func TestLogsFollowAcrossRotationAndFlush(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, ""))
	a.WaitFor("2 ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	logDir := filepath.Join(a.Dir, "logs")

	f := startFollower(t, a, "web", "-f")
	// The tail shows both workers' start lines; after it, the follow is on.
	f.waitCount(t, "the tail", regexp.MustCompile(`started version=`), 2, 10*time.Second)

	logLine := regexp.MustCompile(`\] log \d+ \d+ \d+$`)
	total := 0
	batch := func(n int) {
		t.Helper()
		if _, err := get(t, port, fmt.Sprintf("/log?n=%d", n)); err != nil {
			t.Fatal(err)
		}
		total += n
		f.waitCount(t, fmt.Sprintf("batch of %d", n), logLine, total, 10*time.Second)
	}
	batch(5)
	if r := a.CLI("logs", "--rotate"); r.Code != 0 || !strings.Contains(r.Stdout, "rotated "+filepath.Join(logDir, "web.out.log")) {
		t.Fatalf("logs --rotate: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if n := len(logFilesOf(t, logDir, "web.out")); n != 2 {
		t.Fatalf("after a rotation: %d web.out files, want 2", n)
	}
	batch(6)
	// Two rotations in a row, then lines: the follow skips the empty file.
	for range 2 {
		if r := a.CLI("logs", "--rotate", "web"); r.Code != 0 {
			t.Fatalf("logs --rotate web: exit %d\n%s", r.Code, r.Stderr)
		}
	}
	batch(7)
	a.Signal(syscall.SIGUSR1)
	batch(8)

	// The plain tail: the last 3 lines, and the rotated files behind them.
	lastBatch := regexp.MustCompile(`^\S+ \[web \d+ \d+\] log \d+ \d+ 6\n.* log \d+ \d+ 7\n.* log \d+ \d+ 8\n$`)
	if r := a.CLI("logs", "web", "--out", "-n", "3"); r.Code != 0 || !lastBatch.MatchString(r.Stdout) {
		t.Errorf("logs web -n 3: exit %d, want lines 6 to 8 of the last batch:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	checkLogsOfEveryApp(t, a, 2+total)
	if r := a.CLI("logs", "--flush", "web"); r.Code != 0 || !strings.Contains(r.Stdout, "emptied") {
		t.Fatalf("logs --flush web: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if files := logFilesOf(t, logDir, "web.out"); len(files) != 1 {
		t.Errorf("after --flush: files %v, want the current one only", files)
	}
	if r := a.CLI("logs", "web"); r.Code != 0 || r.Stdout != "" {
		t.Errorf("logs web after --flush: exit %d, want no lines:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	batch(9)
	time.Sleep(300 * time.Millisecond) // longer than a Follow poll: a line twice would show now
	if n := f.count(logLine); n != total {
		t.Errorf("`deployd logs -f` printed %d log lines, want %d: none lost, none twice", n, total)
	}

	// Ctrl-C ends the follow cleanly.
	_ = f.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		t.Fatal("`deployd logs -f` did not exit within 5s of SIGINT")
	}
	if err := f.cmd.Wait(); err != nil {
		t.Errorf("`deployd logs -f` after SIGINT: %v, want exit 0", err)
	}
}

// TestLogsFullDiskKeepsWorkersServing puts log_dir on a 64 KiB tmpfs, fills
// it, and makes the workers log while they serve: no request may fail (a
// worker blocked on a full pipe would time out), status reports the
// dropped lines, and once there is room the log says how many were lost.
func TestLogsFullDiskKeepsWorkersServing(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, ""))
	logDir := filepath.Join(a.Dir, "logs")
	if err := os.Mkdir(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, logDir, "64k") // before Start, so it is unmounted after the agent stopped
	a.Start()
	a.WaitFor("2 ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })

	filler := filepath.Join(logDir, "filler")
	fillDisk(t, filler)

	requests, failures, errs := loadWhileLogging(t, port, 4, 2*time.Second)
	t.Logf("%d requests, %d failed, while log_dir was full", requests, failures)
	if failures > 0 || requests < 20 {
		t.Errorf("with log_dir full: %d of %d requests failed (%v); want none failed of at least 20",
			failures, requests, errs[:min(len(errs), 3)])
	}
	dropped := appOf(a.Status(), "web").DroppedLogLines
	if dropped == 0 {
		t.Fatalf("status reports no dropped log lines although log_dir is full")
	}
	if r := a.CLI("status"); !strings.Contains(r.Stdout, "log lines dropped") {
		t.Errorf("`deployd status` should mention the dropped log lines:\n%s", r.Stdout)
	}

	// Room again: the next lines are written, after a marker with the count.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, port, "/log?n=3"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	marker := regexp.MustCompile(`\[deployd\] deployd: dropped (\d+) lines \(.*no space left on device`)
	for {
		b, _ := os.ReadFile(filepath.Join(logDir, "web.out.log"))
		if m := marker.FindSubmatch(b); m != nil {
			t.Logf("status: %d dropped; log marker: %s", dropped, m[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no drop marker in the log 10s after the disk had room again:\n%s", tailOf(string(b), 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
