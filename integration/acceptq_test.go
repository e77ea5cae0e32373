package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/sockdiag"
)

// TestSteeredAcceptQueuePerWorker: with balance even, a worker that stops
// accepting (SIGSTOP: its own socket stays in the kernel's map and keeps
// getting its share of new connections) holds every connection steered to
// it in its accept queue. `status --json` and /metrics show that queue on
// that worker, 0 on the other, the listener's total, and the balance,
// spares and steered connections as status has them; the growing queue is
// warned about, naming the worker; after SIGCONT it drains. The same
// again after an agent upgrade, whose new agent adopts workers already
// steered (it holds no copy of their sockets and finds them in /proc) and
// goes on counting their new connections from where the old one was.
//
// The counts are exact: the kernel completes each handshake without the
// worker and queues the connection on the socket the program picked; the
// stopped worker takes none out and its backlog (somaxconn) is far above
// what the test makes, so its queue only grows, and the test reads it
// itself (listenQueue) to compare (once every thread of the worker is
// stopped: kill returns before that). new_connections (the program's picks) rose by as much. Nothing else
// connects to the listener (readiness is sd_notify).
func TestSteeredAcceptQueuePerWorker(t *testing.T) {
	needSteering(t)
	port, mport := FreePort(t), FreePort(t)
	a := NewAgentDir(t, bins, fmt.Sprintf("metrics = \"127.0.0.1:%d\"\n\n", mport)+
		versionedApp(port, 2, "v1", "", `balance = "even"`))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := allWorkerPIDs(st)
	stopOneWorker(t, a, port, mport)
	counts := map[int]uint64{} // pid → new connections before the upgrade
	for _, w := range appOf(a.Status(), "web").Workers {
		if w.NewConnections == nil || *w.NewConnections == 0 {
			t.Fatalf("worker %d: new_connections %v before the upgrade, want a count above 0", w.PID, w.NewConnections)
		}
		counts[w.PID] = *w.NewConnections
	}

	cand := filepath.Join(t.TempDir(), "deployd-new")
	CopyFile(t, bins.DeploydV2, cand)
	old := a.PID()
	if r := a.CLI("upgrade", "--binary", cand); r.Code != 0 {
		t.Fatalf("upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	// The old agent must be gone before a worker is stopped: its exit
	// orphans the workers' process groups, and the kernel sends SIGHUP
	// (which ends the test app) to an orphaned group with a stopped member.
	waitExited(t, old, 10*time.Second)
	st = a.WaitFor("adopted", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if now := allWorkerPIDs(st); fmt.Sprint(keys(now)) != fmt.Sprint(keys(before)) {
		t.Fatalf("workers %v, before the upgrade %v: not adopted", keys(now), keys(before))
	}
	// The adopted workers' counts go on from where they were: the old
	// agent hands over each place's count at the time its worker took it.
	for _, w := range appOf(st, "web").Workers {
		switch b := counts[w.PID]; {
		case w.NewConnections == nil:
			t.Fatalf("adopted worker %d: new_connections unknown after the upgrade (before: %d)", w.PID, b)
		case *w.NewConnections < b:
			t.Fatalf("adopted worker %d: new_connections %d after the upgrade, %d before: counted again from 0",
				w.PID, *w.NewConnections, b)
		}
	}
	stopOneWorker(t, a, port, mport)
}

// waitStopped waits until every thread of pid is stopped. kill(SIGSTOP)
// returns before that: one thread is woken to start the group stop, and
// until each has stopped the others may still accept (seen in CI: 6 of
// 15 connections steered to a "stopped" worker were taken out of its
// queue).
func waitStopped(t *testing.T, pid int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatalf("threads of %d: %v", pid, err)
		}
		running := ""
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				continue // a thread that ended
			}
			// The state follows the command's closing parenthesis.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				running = task.Name()
				break
			}
		}
		if running == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %s of %d not stopped %v after SIGSTOP", running, pid, bound)
		}
		time.Sleep(time.Millisecond) // polls the condition above
	}
}

// stopOneWorker stops the app's worker of slot 1 from accepting, connects
// until the kernel steered some connections to it, checks status and
// metrics, then resumes it and closes the connections.
func stopOneWorker(t *testing.T, a *Agent, port, mport int) {
	ws := appOf(a.Status(), "web").Workers
	if len(ws) != 2 {
		t.Fatalf("want 2 workers: %+v", ws)
	}
	other, stopped := ws[0], ws[1]
	if other.NewConnections == nil || stopped.NewConnections == nil {
		t.Fatalf("steered workers without new_connections: %+v", ws)
	}
	if err := syscall.Kill(stopped.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, stopped.PID, 10*time.Second)
	cont := func() { syscall.Kill(stopped.PID, syscall.SIGCONT) }
	t.Cleanup(cont) // before the agent's Stop, which runs later (cleanups run last first)
	defer cont()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func() {
		t.Helper()
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns)+1, err)
		}
		conns = append(conns, c)
	}
	// queued is how many connections wait in the stopped worker's own
	// socket, read here apart from the agent: its listening socket found
	// in its /proc/PID/fd, its queue in a dump of the kernel's sockets.
	// It cannot shrink while the worker is stopped.
	queued := func() int { return listenQueue(t, stopped.PID, port) }
	const want, maxDials = 8, 200
	for queued() < want {
		if len(conns) >= maxDials {
			t.Fatalf("%d connections, %d queued at the stopped worker: the kernel does not spread them", len(conns), queued())
		}
		for range 10 {
			dial()
		}
	}

	// Status: the stopped worker's queue holds what waits in its socket;
	// the other's is empty (it accepts); the listener's total is the
	// stopped worker's.
	var app api.App
	deadline := time.Now().Add(10 * time.Second)
	for {
		app = statusJSON(t, a)
		n := queued()
		s, o := workerByPID(t, app, stopped.PID), workerByPID(t, app, other.PID)
		if s.Queued != nil && *s.Queued == n && o.Queued != nil && *o.Queued == 0 &&
			len(app.AcceptQueues) == 1 && app.AcceptQueues[0].Queued == n {
			t.Logf("%d connections: the stopped worker's queue %d, the other's %d; listener %+v",
				len(conns), *s.Queued, *o.Queued, app.AcceptQueues[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %d connections, %d in the stopped worker's queue; status: stopped worker queued %v, "+
				"other %v, listeners %+v", len(conns), n, orAbsent(s.Queued), orAbsent(o.Queued), app.AcceptQueues)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s := workerByPID(t, app, stopped.PID)
	switch {
	case s.NewConnections == nil:
		t.Errorf("the stopped worker has no new_connections")
	case int(*s.NewConnections-*stopped.NewConnections) != *s.Queued:
		t.Errorf("new_connections of the stopped worker rose by %d, its queue holds %d",
			*s.NewConnections-*stopped.NewConnections, *s.Queued)
	}
	r := a.CLI("status", "web")
	line := fmt.Sprintf("web[%d] pid %d: ", s.Slot, s.PID)
	if r.Code != 0 || !strings.Contains(r.Stdout, line) || !strings.Contains(r.Stdout, fmt.Sprintf("%d queued", *s.Queued)) {
		t.Errorf("status: exit %d, want a line %q... %d queued:\n%s", r.Code, line, *s.Queued, r.Stdout)
	}
	t.Logf("status:\n%s", r.Stdout)
	listen := app.AcceptQueues[0]
	if listen.Backlog <= 0 || !strings.Contains(listen.Listen, strconv.Itoa(port)) {
		t.Errorf("listener %+v: want its address and a backlog", listen)
	}
	checkQueueMetrics(t, a, mport, app, listen)

	// One more connection for the stopped worker: its queue grows, and
	// the warning names it (not the other).
	for n := queued(); queued() == n; {
		if len(conns) >= maxDials {
			t.Fatalf("%d connections: no more steered to the stopped worker", len(conns))
		}
		dial()
	}
	a.WaitFor("a warning naming the stopped worker", 10*time.Second, func(st *api.Status) bool {
		w := appOf(st, "web").Warnings
		return len(w) == 1 && strings.Contains(w[0], fmt.Sprintf("(pid %d;", stopped.PID))
	})

	// Resumed, the worker accepts what waited: its queue empties and the
	// warning clears.
	cont()
	a.WaitFor("the queue drained", 10*time.Second, func(st *api.Status) bool {
		w := workerByPID(t, appOf(st, "web"), stopped.PID)
		return w.Queued != nil && *w.Queued == 0 && len(appOf(st, "web").Warnings) == 0
	})
}

// checkQueueMetrics: a scrape shows what status (app) shows. Nothing
// connects meanwhile, so both read the same figures.
func checkQueueMetrics(t *testing.T, a *Agent, mport int, app api.App, listen api.AcceptQueue) {
	t.Helper()
	t0 := time.Now()
	mfs := scrape(t, mport)
	took := time.Since(t0)
	if again := statusJSON(t, a); fmt.Sprint(again.AcceptQueues) != fmt.Sprint(app.AcceptQueues) {
		t.Fatalf("the queues changed while nothing connected: %+v, then %+v", app.AcceptQueues, again.AcceptQueues)
	}
	expect := func(name string, want *float64, labels ...string) {
		t.Helper()
		got, ok := sample(mfs, name, append([]string{"app", "web"}, labels...)...)
		switch {
		case want == nil && ok:
			t.Errorf("%s%v = %v, want none (status --json has none)", name, labels, got)
		case want != nil && (!ok || got != *want):
			t.Errorf("%s%v = %v (present %v), want %v (status --json)", name, labels, got, ok, *want)
		}
	}
	f := func(v float64) *float64 { return &v }
	for _, w := range app.Workers {
		slot, pid := strconv.Itoa(w.Slot), strconv.Itoa(w.PID)
		expect("deployd_worker_accept_queue", f(float64(*w.Queued)), "slot", slot, "pid", pid)
		var nc *float64
		if w.NewConnections != nil {
			nc = f(float64(*w.NewConnections))
		}
		expect("deployd_worker_new_connections_total", nc, "slot", slot, "pid", pid)
	}
	expect("deployd_listener_accept_queue", f(float64(listen.Queued)), "listen", listen.Listen)
	expect("deployd_listener_accept_backlog", f(float64(listen.Backlog)), "listen", listen.Listen)
	expect("deployd_app_balance_info", f(1), "balance", "even", "asked", "even")
	expect("deployd_app_spares", f(float64(app.Spares)))
	expect("deployd_app_spares_ready", f(0))
	t.Logf("scrape took %v", took.Round(time.Microsecond))
}

// listenQueue is how many connections wait in the accept queues of the
// sockets listening on port that pid holds.
func listenQueue(t *testing.T, pid, port int) int {
	t.Helper()
	held, err := sockdiag.Inodes(pid)
	if err != nil {
		t.Fatal(err)
	}
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen},
		func(s *sockdiag.Socket) bool { return int(s.Local.Port()) == port && held[s.Inode] })
	if err != nil || len(socks) == 0 {
		t.Fatalf("pid %d: listening sockets on port %d: %+v %v, want its own; it holds %v", pid, port, socks, err, held)
	}
	n := 0
	for _, s := range socks {
		n += int(s.RecvQ)
	}
	return n
}

// statusJSON runs `deployd status --json web`.
func statusJSON(t *testing.T, a *Agent) api.App {
	t.Helper()
	r := a.CLI("status", "--json", "web")
	if r.Code != 0 {
		t.Fatalf("status --json: exit %d\n%s", r.Code, r.Stderr)
	}
	var st api.Status
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.Stdout)
	}
	return appOf(&st, "web")
}

// workerByPID is app's worker pid.
func workerByPID(t *testing.T, app api.App, pid int) api.Worker {
	t.Helper()
	for _, w := range app.Workers {
		if w.PID == pid {
			return w
		}
	}
	t.Fatalf("no worker pid %d: %+v", pid, app.Workers)
	return api.Worker{}
}

func orAbsent(p *int) any {
	if p == nil {
		return "absent"
	}
	return *p
}
