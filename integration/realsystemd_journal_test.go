package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
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
// handoff to a new agent). journalctl must then show each line exactly
// once, with its fields, and the agent's own log as structured entries
// (what it said about web has DEPLOYD_APP=web).
//
// Where no systemd can boot it skips, and under CI=true it fails
// (bootSystemd). On a failure it logs, for each repeated line, which agent
// sent each copy in which recorded batch (logCopies): that is how the
// cause of the repeats it once found was seen (an agent killed right after
// it settled the batch a killed agent had sent in part).
func TestRealSystemdJournalEveryLineOnce(t *testing.T) {
	parallelUnderLoad(t)
	const workers, perWorker = 2, 100_000
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, workers, fmt.Sprintf(`env = { TESTAPP_LOG_SPAM = "%d" }
[apps.web.logs]
target = "journal"
`, perWorker)))
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
	pids := fmt.Sprint(PIDs(appOf(st, "web")))

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
	events := []string{"SIGKILL", "SIGKILL", "systemctl reload", "SIGKILL"}
	for i, ev := range events {
		waitFlow(fmt.Sprintf("before event %d (%s)", i+1, ev))
		old := st.Agent.PID
		if ev == "SIGKILL" {
			host := sd.hostPID(old)
			if host == 0 {
				t.Fatalf("event %d: agent pid %d not found on the machine", i+1, old)
			}
			if err := syscall.Kill(host, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		} else {
			sd.mustCtl("reload", "deployd")
		}
		for deadline := time.Now().Add(30 * time.Second); !a.agentAnswers() || sd.mainPID("deployd") == old; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("event %d (%s): no next agent within 30 s:\n%s", i+1, ev, sd.journal("deployd"))
			}
		}
		st = a.WaitFor("the next agent", 60*time.Second, func(st *api.Status) bool {
			return st.Agent.PID != old && AllReady(st, "web", workers)
		})
		if got := fmt.Sprint(PIDs(appOf(st, "web"))); got != pids {
			t.Fatalf("event %d (%s) replaced workers: %s, then %s", i+1, ev, pids, got)
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
		if c.complete(workers) || time.Since(grew) > 20*time.Second {
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
	if len(c.bad) > 0 {
		t.Errorf("%d unexpected entries, e.g. %q", len(c.bad), c.bad[:min(len(c.bad), 3)])
	}
	if len(c.seen) != workers {
		t.Errorf("lines of %d pids, want %d", len(c.seen), workers)
	}
	for pid := range c.seen {
		if m := c.missing(pid); m > 0 {
			t.Errorf("pid %d: %d of %d lines missing", pid, m, perWorker)
		}
	}
	if len(c.extra) > 0 {
		t.Errorf("%d lines are in the journal more than once, e.g. %v", len(c.extra), firstKeys(c.extra, 3))
		logCopies(t, sd, c)
	}
	// deployd logs reads the journal for such an app: the last lines, in
	// the text format.
	if r := a.CLI("logs", "web", "-n", "3"); r.Code != 0 || strings.Count(r.Stdout, "] line ") != 3 || !strings.Contains(r.Stdout, "[web ") {
		t.Errorf("deployd logs web -n 3: exit %d, want the app's last 3 lines from the journal:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
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
