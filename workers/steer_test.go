package workers

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/steer"
)

func init() { helpers["answer"] = answer }

// answer serves fd 3: every connection gets "PID\n" and is closed. On
// SIGTERM it stops accepting (closes its socket), answers what it accepted
// and exits.
func answer() int { return serveAnswers(true) }

// serveAnswers is answer; with ready false it serves without ever
// reporting readiness.
func serveAnswers(ready bool) int {
	term := notifyTerm()
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 4
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				fmt.Fprintf(c, "%d\n", os.Getpid())
				c.Close()
			}()
		}
	}()
	if ready {
		if err := sdNotify("READY=1"); err != nil {
			return 5
		}
	}
	<-term
	ln.Close()
	wg.Wait()
	return 0
}

// steeredListener leases a loopback listener with balance b.
func steeredListener(t *testing.T, b string) (*handoff.Listener, string) {
	t.Helper()
	if err := steer.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and kernel steering is unavailable: %v", err)
		}
		t.Skipf("kernel steering unavailable: %v", err)
	}
	r := handoff.NewRegistry(nil, nil, nil)
	lease, err := r.Acquire("web", []handoff.Want{{URL: "tcp://127.0.0.1:0#http", Network: "tcp",
		Address: "127.0.0.1:0", Name: "http", Balance: b}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Release(); r.Close() })
	l := lease.Bound()[0].Listener
	if l.Balance() != b {
		t.Fatalf("listener balance %q, want %q", l.Balance(), b)
	}
	addr, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	return l, addr
}

// ask connects to addr from src ("" = any) and returns the answering pid.
func ask(addr, src string) (int, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(line))
}

// tally is the outcome of a load: answers per pid, and failures.
type tally struct {
	mu     sync.Mutex
	by     map[int]int
	failed []error
}

// load asks addr from conc clients until stop is closed (at most max
// requests in all) and returns the tally.
func load(addr string, conc, max int, stop <-chan struct{}) *tally {
	tl := &tally{by: map[int]int{}}
	var n atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n.Add(1) <= int64(max) && !isClosed(stop) {
				pid, err := ask(addr, "")
				tl.mu.Lock()
				if err != nil {
					tl.failed = append(tl.failed, err)
				} else {
					tl.by[pid]++
				}
				tl.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return tl
}

func TestSteeredReloadLosesNothing(t *testing.T) {
	for _, b := range []string{handoff.BalanceEven, handoff.BalanceSticky} {
		t.Run(b, func(t *testing.T) {
			l, addr := steeredListener(t, b)
			spec := testSpec(t, l, "answer", 3)
			s := newSupervisor(t, spec)
			mustStart(t, s)
			if got := s.Status().Balance; got != b {
				t.Fatalf("status balance %q, want %q", got, b)
			}
			before := load(addr, 4, 300, nil)
			if len(before.failed) > 0 || (b == handoff.BalanceEven && len(before.by) != 3) {
				t.Fatalf("before the reload: %d failed (%v), answers by pid %v", len(before.failed), before.failed, before.by)
			}
			// The program counts its choices: a SYN the kernel dropped
			// after it chose (the client sends it again) counts twice, so
			// a count may exceed the answers by a few, never fall short.
			for _, w := range s.Status().Workers {
				if got, answered := w.SteeredConnections, uint64(before.by[w.PID]); !w.Steered || got < answered || got > answered+3 {
					t.Errorf("worker %d: status counts %d connections (steered %v); it answered %d",
						w.PID, got, w.Steered, answered)
				}
			}
			stop := make(chan struct{})
			var during *tally
			done := make(chan struct{})
			go func() { defer close(done); during = load(addr, 4, 100000, stop) }()
			for i := range 2 {
				spec = nextSpec(spec, "answer")
				if err := s.Reload(spec, Rolling, nil); err != nil {
					close(stop)
					t.Fatalf("reload %d: %v", i, err)
				}
			}
			close(stop)
			<-done
			if len(during.failed) > 0 {
				t.Fatalf("%d of %d requests failed during two reloads: %v", len(during.failed),
					len(during.failed)+sum(during.by), during.failed[:min(5, len(during.failed))])
			}
			now := pids(currentWorkers(s))
			after := load(addr, 2, 60, nil)
			for pid := range after.by {
				if !containsInt(now, pid) {
					t.Errorf("pid %d answered after the reload; the pool is %v", pid, now)
				}
			}
			t.Logf("%s: %d requests during two reloads, 0 failed", b, sum(during.by))
		})
	}
}

func sum(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// homes asks from each client address n times and returns the pid that
// answered each; every answer of one client must come from one pid.
func homes(t *testing.T, addr string, clients, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for c := 2; c < 2+clients; c++ {
		src := fmt.Sprintf("127.0.0.%d", c)
		for range n {
			pid, err := ask(addr, src)
			if err != nil {
				t.Fatalf("%s: %v", src, err)
			}
			if home, ok := out[src]; ok && home != pid {
				t.Fatalf("%s was answered by pid %d and by pid %d", src, home, pid)
			}
			out[src] = pid
		}
	}
	return out
}

func TestStickyClientsStayAndMoveTogether(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceSticky)
	s := newSupervisor(t, testSpec(t, l, "answer", 3))
	mustStart(t, s)
	first := homes(t, addr, 12, 4)
	byPid := map[int][]string{}
	for src, pid := range first {
		byPid[pid] = append(byPid[pid], src)
	}
	if len(byPid) < 2 {
		t.Fatalf("12 clients all on %v", byPid)
	}
	// Kill one worker: its clients all move to one other worker.
	var victim *Worker
	for _, w := range currentWorkers(s) {
		if len(byPid[w.PID]) > 0 {
			victim = w
		}
	}
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitChan(t, "the killed worker's exit", victim.Done())
	moved := homes(t, addr, 12, 4)
	dest := map[int]bool{}
	for src, pid := range first {
		if pid == victim.PID {
			dest[moved[src]] = true
		} else if moved[src] != pid {
			t.Errorf("%s moved from pid %d to %d though its worker lives", src, pid, moved[src])
		}
	}
	if len(dest) != 1 || dest[victim.PID] {
		t.Errorf("the killed worker's clients went to %v; want all to one other worker", dest)
	}
}

func TestSteeredShrinkGivesTheGoneSlotNothing(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	s := newSupervisor(t, testSpec(t, l, "answer", 3))
	mustStart(t, s)
	if err := s.Scale(2, nil); err != nil {
		t.Fatal(err)
	}
	now := pids(currentWorkers(s))
	tl := load(addr, 2, 100, nil)
	if len(tl.failed) > 0 || len(tl.by) != 2 {
		t.Fatalf("after scale 2: %d failed (%v), answers by %v; the pool is %v", len(tl.failed), tl.failed, tl.by, now)
	}
	for pid := range tl.by {
		if !containsInt(now, pid) {
			t.Errorf("pid %d answered; the pool is %v", pid, now)
		}
	}
	if err := s.Scale(3, nil); err != nil {
		t.Fatal(err)
	}
	if tl := load(addr, 2, 150, nil); len(tl.failed) > 0 || len(tl.by) != 3 {
		t.Fatalf("after scale 3: %d failed, answers by %v", len(tl.failed), tl.by)
	}
}

// answerSlowAgain is answer, ready at once the first time it runs and
// after 500 ms the next times (MARKER is the file that tells).
func answerSlowAgain() int {
	if _, err := os.Stat(os.Getenv("MARKER")); err == nil {
		time.Sleep(500 * time.Millisecond)
	} else if err := os.WriteFile(os.Getenv("MARKER"), nil, 0o600); err != nil {
		return 6
	}
	return answer()
}

func init() { helpers["answer-slow-again"] = answerSlowAgain }

// TestAdoptedStartingWorkerJoinsTheMap: a worker still starting when an
// agent hands over crosses with its own socket, and the next agent puts
// it in its slot once it is ready.
func TestAdoptedStartingWorkerJoinsTheMap(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer-slow-again", 2)
	spec.Env = append(spec.Env, "MARKER="+t.TempDir()+"/started")
	old := New(Options{App: "web", Shim: testBinary(t)}, spec)
	mustStart(t, old)
	if err := syscall.Kill(currentWorkers(old)[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "slot 1 restarting", func() bool {
		w := currentWorkers(old)[1]
		return w.State() == Starting && w.PID > 0
	})
	hs, err := old.HandOver()
	if err != nil {
		t.Fatalf("HandOver: %v", err)
	}
	got := handOverTo(t, hs)
	old.Release()
	next := newSupervisor(t, spec)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	ws := currentWorkers(next)
	waitChan(t, "the adopted worker's readiness", ws[1].Ready())
	waitFor(t, "the adopted worker in its slot", func() bool { return membersLeft(ws[1]) == 0 })
	tl := load(addr, 1, 20, nil)
	if len(tl.failed) > 0 || tl.by[ws[0].PID] != 10 || tl.by[ws[1].PID] != 10 {
		t.Fatalf("answers %v (failed %v); want 10 each from %v", tl.by, tl.failed, pids(ws))
	}
}

func membersLeft(w *Worker) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.members)
}

// spareOf returns the pid of the ready spare in st, 0 when none.
func spareOf(st AppStatus) int {
	for _, w := range st.Workers {
		if w.Spare && w.State == Ready {
			return w.PID
		}
	}
	return 0
}

func TestSpareTakesACrashedWorkersPlaceAtOnce(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer-slow-again", 3) // 2 serving, 1 spare; restarts take 500 ms
	spec.Env = append(spec.Env, "MARKER="+t.TempDir()+"/started")
	spec.Spares = 1
	s := newSupervisor(t, spec)
	mustStart(t, s)
	st := s.Status()
	spare := spareOf(st)
	if st.Instances != 2 || st.Spares != 1 || spare == 0 {
		t.Fatalf("status: %d instances, %d spares, spare pid %d; want 2, 1 and a ready spare", st.Instances, st.Spares, spare)
	}
	tl := load(addr, 1, 20, nil)
	if len(tl.failed) > 0 || len(tl.by) != 2 || tl.by[spare] != 0 {
		t.Fatalf("answers %v (failed %v): the 2 serving workers, not the spare %d", tl.by, tl.failed, spare)
	}
	var victim *Worker
	for _, w := range currentWorkers(s) {
		if w.PID != spare {
			victim = w
		}
	}
	t0 := time.Now()
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the spare in the crashed worker's place", func() bool {
		for _, w := range s.Status().Workers {
			if w.PID == spare {
				return !w.Spare
			}
		}
		return false
	})
	took := time.Since(t0)
	tl = load(addr, 1, 20, nil)
	if len(tl.failed) > 0 || tl.by[spare] != 10 || len(tl.by) != 2 {
		t.Fatalf("after the crash: answers %v (failed %v); want 10 from the former spare %d", tl.by, tl.failed, spare)
	}
	waitFor(t, "a new spare", func() bool { p := spareOf(s.Status()); return p != 0 && p != spare })
	t.Logf("a spare served in the crashed worker's place %v after the SIGKILL", took.Round(time.Microsecond))
}

// TestSparesCrossAHandover: after a spare took a crashed worker's place,
// an agent upgrade keeps who serves and who is the spare, and the adopted
// spare can still take a place.
func TestSparesCrossAHandover(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer", 3)
	spec.Spares = 1
	old := New(Options{App: "web", Shim: testBinary(t)}, spec)
	mustStart(t, old)
	ws := currentWorkers(old)
	if err := syscall.Kill(ws[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "slot 0 back as the spare", func() bool {
		p := spareOf(old.Status())
		return p != 0 && p == currentWorkers(old)[0].PID
	})
	spare := currentWorkers(old)[0].PID
	pool, hs, err := old.HandOverPool()
	if err != nil {
		t.Fatalf("HandOver: %v", err)
	}
	pool = roundTrip(t, pool)
	got := handOverTo(t, hs)
	old.Release()
	next := newSupervisor(t, spec)
	if err := next.AdoptPool(pool, got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if p := spareOf(next.Status()); p != spare {
		t.Fatalf("after the handover the spare is %d, want %d (status %+v)", p, spare, next.Status().Workers)
	}
	serving := pids(currentWorkers(next))[1:]
	if tl := load(addr, 1, 20, nil); len(tl.failed) > 0 || tl.by[serving[0]] != 10 || tl.by[serving[1]] != 10 {
		t.Fatalf("answers %v (failed %v); want 10 each from %v", tl.by, tl.failed, serving)
	}
	if err := syscall.Kill(serving[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the adopted spare in place", func() bool {
		tl := load(addr, 1, 2, nil)
		return len(tl.failed) == 0 && tl.by[spare] == 1
	})
}

// A worker adopted with a count base from a steered pool, in a pool that
// is not steered (any more), has an unknown count: never 0 minus the base.
func TestConnectionsUnknownWithoutSteering(t *testing.T) {
	w := &Worker{}
	sl := &slot{cur: w}
	st := &state{spec: &Spec{}, pos: map[*slot]int{sl: 0}, connBase: map[*Worker]uint64{w: 42}}
	if n, ok := st.connections(sl); ok {
		t.Fatalf("connections = %d, known, in a pool with no steered listener", n)
	}
}

// The base handed over is adopted only for the place it was taken from.
func TestAdoptConnBaseOnlyForItsPlace(t *testing.T) {
	w := &Worker{}
	sl := &slot{cur: w}
	st := &state{pos: map[*slot]int{sl: 1}}
	zero, one, base := 0, 1, uint64(42)
	st.adoptConnBase(sl, &SlotHandover{Position: &zero, ConnBase: &base})
	if _, ok := st.connBase[w]; ok {
		t.Fatalf("a base of place 0 adopted for a worker at place 1")
	}
	st.adoptConnBase(sl, &SlotHandover{Position: &one, ConnBase: &base})
	if got := st.connBase[w]; got != base {
		t.Fatalf("base %d, want %d", got, base)
	}
}
