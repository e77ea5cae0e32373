package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestRealSystemdJournalEveryLineOnce: 2 workers of an app with
// [apps.web.logs] target = "journal" write 100 000 numbered lines each,
// under the unit `deployd startup systemd` writes, in a real systemd with
// its own journald. Meanwhile the agent is SIGKILLed 3 times (systemd's
// Restart= starts the next one, which adopts the workers and settles what
// the dead one was sending) and upgraded once (systemctl reload: a
// handoff to a new agent), and the app is reloaded once (`deployd reload
// web`: 2 new workers write their 100 000 lines each; the 2 it replaced
// stop at a chunk of theirs). journalctl must then show each line exactly
// once, with its fields, and the agent's own log as structured entries
// (what it said about web has DEPLOYD_APP=web).
//
// Where no systemd can boot it skips, and under CI=true it fails
// (bootSystemd). On a failure it logs, for each repeated line, which agent
// sent each copy in which recorded batch (logCopies): that is how the
// cause of the repeats it once found was seen (an agent killed right after
// it settled the batch a killed agent had sent in part).
func TestRealSystemdJournalEveryLineOnce(t *testing.T) {
	everyLineOnceUnderSystemd(t, "journal")
}

// TestRealSystemdBothEveryLineOnce is TestRealSystemdJournalEveryLineOnce
// with target = "both": each line once in journalctl, with its fields,
// and once in the log files (rotated every 4 MiB), through the same kills,
// upgrade and reload. A kill that falls between a batch's write to the
// files and its sending to the journal leaves the next agent the two
// places' records in the worker's output journal to settle.
func TestRealSystemdBothEveryLineOnce(t *testing.T) {
	everyLineOnceUnderSystemd(t, "both")
}

// everyLineOnceUnderSystemd is the test of both: web's lines to target.
func everyLineOnceUnderSystemd(t *testing.T, target string) {
	parallelUnderLoad(t)
	const workers, perWorker = 2, 100_000
	port := FreePort(t)
	// A replaced worker stops at the end of a chunk of its lines; one
	// killed at stop_timeout while it waited on its full pipe would leave
	// a part of a line.
	a := NewAgentDir(t, bins, appConfig("web", port, workers, fmt.Sprintf(`stop_timeout = "3m"
env = { TESTAPP_LOG_SPAM = "%d", TESTAPP_TICK = "200ms" }
[apps.web.logs]
target = %q
max_size = "4MiB"
max_files = 1000
`, perWorker, target)))
	sd := bootSystemd(t, a.Dir, bins.Dir)
	a.Journal = func() string { return sd.journal("deployd") }
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config); err != nil {
		t.Fatalf("deployd startup systemd: %v\n%s", err, out)
	}
	if unit, _ := sd.run("systemctl", "cat", "deployd"); !strings.Contains(unit, "LogRateLimitIntervalSec=0") {
		t.Errorf("the unit does not lift journald's rate limit:\n%s", unit)
	}
	// The unit's LogRateLimitIntervalSec=0 reaches journald as an xattr
	// "user.*" of the unit's cgroup, which the cgroup v1 name=systemd
	// hierarchy of this test's systemd (hybrid mode) cannot hold: journald
	// would rate-limit the agent anyway (it did: about 35 000 entries,
	// 10 000 scaled by the free space, then silence). So, as on such a
	// host, journald's own limit is lifted (docs/logs.md).
	if out, err := sd.run("sh", "-c", "mkdir -p /etc/systemd/journald.conf.d && "+
		"printf '[Journal]\\nRateLimitIntervalSec=0\\n' > /etc/systemd/journald.conf.d/deployd.conf && "+
		"systemctl restart systemd-journald"); err != nil {
		t.Fatalf("lift journald's rate limit: %v\n%s", err, out)
	}
	sd.mustCtl("daemon-reload")
	t0 := time.Now()
	sd.mustCtl("start", "deployd")
	st := a.WaitFor("ready under systemd", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", workers) })
	pids := PIDs(appOf(st, "web"))

	// last is the cursor of the app's newest entry: it moves while lines flow.
	last := func() string {
		out, _ := sd.run("journalctl", "--no-pager", "-q", "-n", "1", "-o", "json", "--output-fields=DEPLOYD_APP", "DEPLOYD_APP=web")
		var e struct {
			Cursor string `json:"__CURSOR"`
		}
		_ = json.Unmarshal([]byte(out), &e)
		return e.Cursor
	}
	waitFlow := func(what string) {
		c := last()
		for deadline := time.Now().Add(20 * time.Second); last() == c; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no new entry of web in the journal for 20 s:\n%s", what, sd.journal("deployd"))
			}
		}
	}
	events := []string{"SIGKILL", "deployd reload web", "SIGKILL", "systemctl reload", "SIGKILL"}
	for i, ev := range events {
		waitFlow(fmt.Sprintf("before event %d (%s)", i+1, ev))
		old := st.Agent.PID
		switch ev {
		case "SIGKILL":
			host := sd.hostPID(old)
			if host == 0 {
				t.Fatalf("event %d: agent pid %d not found on the machine", i+1, old)
			}
			if err := syscall.Kill(host, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		case "systemctl reload":
			sd.mustCtl("reload", "deployd")
		case "deployd reload web":
			if r := a.CLIWithin(2*time.Minute, "reload", "web"); r.Code != 0 {
				t.Fatalf("event %d: deployd reload web: exit %d\n%s%s", i+1, r.Code, r.Stdout, r.Stderr)
			}
			// The replaced workers' last lines are still being written
			// after they exited (into the journal, a few thousand a
			// second); an agent killed meanwhile loses them with the only
			// copy of their output journals (RELIABILITY.md: seen here as
			// a batch of each missing from the journal and not from the
			// files). So the next kill waits until no worker drains.
			st = a.WaitFor("the new workers, the old ones gone", 2*time.Minute, func(st *api.Status) bool {
				return AllReady(st, "web", workers) && len(appOf(st, "web").Draining) == 0
			})
			next := PIDs(appOf(st, "web"))
			for slot, pid := range next {
				if pids[slot] == pid {
					t.Fatalf("event %d: the reload kept worker %d (pid %d)", i+1, slot, pid)
				}
			}
			pids = next
			t.Logf("event %d (%s): workers %v at %s", i+1, ev, pids, time.Since(t0).Round(time.Millisecond))
			continue
		}
		for deadline := time.Now().Add(30 * time.Second); !a.agentAnswers() || sd.mainPID("deployd") == old; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("event %d (%s): no next agent within 30 s:\n%s", i+1, ev, sd.journal("deployd"))
			}
		}
		st = a.WaitFor("the next agent", 60*time.Second, func(st *api.Status) bool {
			return st.Agent.PID != old && AllReady(st, "web", workers)
		})
		if got := PIDs(appOf(st, "web")); fmt.Sprint(got) != fmt.Sprint(pids) {
			t.Fatalf("event %d (%s) replaced workers: %v, then %v", i+1, ev, pids, got)
		}
		t.Logf("event %d (%s): agent %d -> %d at %s", i+1, ev, old, st.Agent.PID, time.Since(t0).Round(time.Millisecond))
	}

	var c *spamCount
	bad, total, grew := 0, -1, time.Now()
	for ; ; time.Sleep(time.Second) {
		c, bad = countJournal(t, sd)
		if c.total > total {
			total, grew = c.total, time.Now()
		}
		if c.completeFor(pids) || time.Since(grew) > 20*time.Second {
			break
		}
	}
	defer func() {
		if t.Failed() {
			out, _ := sd.run("sh", "-c", "journalctl --no-pager -t deployd -g cannot | head -20; df -h /run; journalctl --disk-usage; journalctl --no-pager -u systemd-journald -n 20; ps -eo pid,stat,pcpu,wchan:30,cmd | grep -v ' \\['; kill -QUIT $(systemctl show -p MainPID --value deployd); sleep 1; journalctl --no-pager -t deployd | grep -A30 'goroutine.*\\[' | grep -v runtime/ | grep -B2 -A12 'logs\\.' | head -150")
			t.Logf("the agent:\n%s", out)
		}
	}()
	t.Logf("%d entries of %d workers in the journal after %s", c.total, len(c.seen), time.Since(t0).Round(time.Millisecond))
	settled, _ := sd.run("journalctl", "--no-pager", "-q", "-u", "deployd", "-g", "settled|cannot|barrier")
	t.Logf("the agents' settling of dead agents' batches:\n%s", settled)
	if bad > 0 {
		t.Errorf("%d entries lack a field or have a wrong one", bad)
	}
	if !everyOnce(t, "journal", c, pids) {
		logCopies(t, sd, c)
	}
	if target == "both" {
		// The files: every line the journal has, once, and nothing else
		// (the files get each batch before the journal does).
		logDir := filepath.Join(a.Dir, "logs")
		f := newSpamCount("line", perWorker)
		f.read(t, logFilesOf(t, logDir, "web.out"))
		t.Logf("%d lines of %d workers in %d files", f.total, len(f.seen), f.files)
		everyOnce(t, "files", f, pids)
		for pid, counts := range c.seen {
			if !slices.Equal(counts, f.seen[pid]) {
				t.Errorf("pid %d: the journal and the files hold different lines", pid)
			}
		}
	}
	// deployd logs reads the journal for such an app (the files for
	// "both"): the last lines, in the text format, and with -f (as the
	// dashboard follows) the ticks the workers print after their lines.
	lastLines := regexp.MustCompile(`(?m)\[web \d \d+\] (line|tick) \d \d+ \d+$`)
	if r := a.CLI("logs", "web", "--out", "-n", "3"); r.Code != 0 || len(lastLines.FindAllString(r.Stdout, -1)) != 3 {
		t.Errorf("deployd logs web --out -n 3: exit %d, want the app's last 3 lines:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	f := startFollower(t, a, "web", "--out", "-f", "-n", "1")
	f.waitCount(t, "deployd logs web -f", regexp.MustCompile(`\] tick \d \d+ \d+$`), 4, 30*time.Second)
	// The agent's own log, under systemd, is structured as the apps'
	// entries are: what it said about web has DEPLOYD_APP=web.
	if out, _ := sd.run("journalctl", "--no-pager", "-q", "-o", "json", "--output-fields=MESSAGE,PRIORITY",
		"SYSLOG_IDENTIFIER=deployd", "DEPLOYD_APP=web"); !strings.Contains(out, `settled the dead agent's batch`) || !strings.Contains(out, `"PRIORITY":"6"`) {
		t.Errorf("no structured entry of the agent's log about web (SYSLOG_IDENTIFIER=deployd DEPLOYD_APP=web):\n%s", tailOf(out, 5))
	}
	if j := sd.journal("deployd"); strings.Contains(j, "Suppressed") {
		t.Errorf("journald dropped messages of the unit (rate limit):\n%s", tailOf(j, 20))
	}
}

// everyOnce checks c, the lines of where ("journal" or "files"): the
// workers running now (pids, by slot) have all their lines, those a
// reload replaced a first part of theirs (they stop at a chunk), each line
// once, 4 workers in all. It reports whether no line is there twice.
func everyOnce(t *testing.T, where string, c *spamCount, pids map[int]int) bool {
	t.Helper()
	if len(c.bad) > 0 {
		t.Errorf("%s: %d unexpected lines, e.g. %q", where, len(c.bad), c.bad[:min(len(c.bad), 3)])
	}
	if len(c.seen) != 2*len(pids) {
		t.Errorf("%s: lines of %d pids, want %d (the workers and those the reload replaced)", where, len(c.seen), 2*len(pids))
	}
	now := map[int]bool{}
	for _, pid := range pids {
		now[pid] = true
	}
	for pid := range c.seen {
		if m, upto := c.missingUpTo(pid); now[pid] && m+c.perLine-upto > 0 {
			t.Errorf("%s: pid %d: %d of %d lines missing", where, pid, m+c.perLine-upto, c.perLine)
		} else if m > 0 {
			t.Errorf("%s: pid %d (replaced): %d of its first %d lines missing", where, pid, m, upto)
		}
	}
	if len(c.extra) > 0 {
		t.Errorf("%s: %d lines are there more than once, e.g. %v", where, len(c.extra), firstKeys(c.extra, 3))
		return false
	}
	return true
}

// countJournal tallies the app's entries in the journal, and counts those
// whose fields are not what the journal sink sets.
func countJournal(t testing.TB, sd *realSystemd) (*spamCount, int) {
	t.Helper()
	out, err := sd.run("journalctl", "--no-pager", "-q", "-o", "json",
		"--output-fields=MESSAGE,SYSLOG_IDENTIFIER,PRIORITY,DEPLOYD_APP,DEPLOYD_WORKER,DEPLOYD_PID,OBJECT_PID,DEPLOYD_STREAM",
		"DEPLOYD_APP=web")
	if err != nil {
		t.Fatalf("journalctl: %v\n%s", err, tailOf(out, 10))
	}
	c := newSpamCount("line", 100_000)
	bad := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			bad++
			continue
		}
		msg, _ := e["MESSAGE"].(string)
		if !strings.HasPrefix(msg, "line ") {
			continue // the app's other output
		}
		f := strings.Fields(msg)
		if len(f) != 4 || e["SYSLOG_IDENTIFIER"] != "web" || e["PRIORITY"] != "6" || e["DEPLOYD_STREAM"] != "out" ||
			e["DEPLOYD_WORKER"] != f[1] || e["DEPLOYD_PID"] != f[2] || e["OBJECT_PID"] != f[2] {
			bad++
		}
		c.addLine([]byte(msg))
	}
	return c, bad
}

func firstKeys(m map[[2]int]int, n int) [][2]int {
	var out [][2]int
	for k := range m {
		if len(out) == n {
			break
		}
		out = append(out, k)
	}
	return out
}

// logCopies logs, for the lines in the journal more than once, which
// agent sent each copy (_PID), in which recorded batch (DEPLOYD_APPEND) and
// at which sequence number: the evidence of where a repeat comes from.
func logCopies(t testing.TB, sd *realSystemd, c *spamCount) {
	out, _ := sd.run("journalctl", "--no-pager", "-q", "-o", "json",
		"--output-fields=MESSAGE,_PID,DEPLOYD_APPEND,DEPLOYD_APPEND_N", "DEPLOYD_APP=web")
	type copyOf struct{ Cursor, PID, Append, N string }
	copies := map[[2]int][]copyOf{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct {
			Message string `json:"MESSAGE"`
			Cursor  string `json:"__CURSOR"`
			PID     string `json:"_PID"`
			Append  string `json:"DEPLOYD_APPEND"`
			N       string `json:"DEPLOYD_APPEND_N"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		var slot, pid, i int
		if _, err := fmt.Sscanf(e.Message, "line %d %d %d", &slot, &pid, &i); err != nil {
			continue
		}
		if k := [2]int{pid, i}; c.extra[k] > 0 {
			copies[k] = append(copies[k], copyOf{e.Cursor, e.PID, e.Append, e.N})
		}
	}
	groups := map[string][]int{}
	for k, cs := range copies {
		var g []string
		for _, c := range cs {
			g = append(g, fmt.Sprintf("agent %s append %q n %s", c.PID, c.Append, c.N))
		}
		key := fmt.Sprintf("pid %d: %s", k[0], strings.Join(g, " | "))
		groups[key] = append(groups[key], k[1])
	}
	for g, is := range groups {
		t.Logf("%d lines (%d..%d) with copies %s", len(is), slices.Min(is), slices.Max(is), g)
	}
	for k, cs := range copies {
		t.Logf("e.g. line %v: %+v", k, cs)
		break
	}
}
