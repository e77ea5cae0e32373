package workers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// slowDrainSpec is the next spec after spec; its workers go on for
// drainFor after their stop signal, then exit with code.
func slowDrainSpec(spec *Spec, drainFor time.Duration, code int) *Spec {
	n := nextSpec(spec, "slow-drain")
	n.Env = append(n.Env, "DRAIN_FOR="+drainFor.String(), "DRAIN_EXIT="+strconv.Itoa(code), "HELPER_LIFETIME=90s")
	return n
}

// watchCapacity counts the ready workers in s's status after every event
// of s until the returned func is called; that func returns the fewest
// counted (-1 when no event came).
func watchCapacity(s *Supervisor) func() int {
	events, cancel := s.Subscribe()
	fewest := -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range events {
			n := 0
			for _, w := range s.Status().Workers {
				if w.State == Ready {
					n++
				}
			}
			if fewest < 0 || n < fewest {
				fewest = n
			}
		}
	}()
	return func() int {
		cancel()
		<-done
		return fewest
	}
}

// drainStarts maps the pid of every worker a reload told to drain to the
// time of its draining event.
func drainStarts(rec *recorder) map[int]time.Time {
	out := map[int]time.Time{}
	for _, e := range rec.events {
		if e.Type == EventDraining {
			out[e.PID] = e.Time
		}
	}
	return out
}

// A rolling reload moves on once an old worker got its stop signal: old
// workers that take stop_timeout to drain cost the reload nothing, they
// drain side by side in the background (status shows them), are killed at
// stop_timeout, and the ready workers never number fewer than instances.
func TestReloadDoesNotWaitForDrains(t *testing.T) {
	t.Parallel()
	const n = 4
	spec := slowDrainSpec(testSpec(t, newListener(t), "serve-ready", n), 0, 0)
	// Long enough that waiting for even one drain shows through the noise
	// of a loaded machine (the old code waited for all 4, one by one).
	spec.StopTimeout = 6 * time.Second
	spec.ReadyTimeout = waitTimeout // 4 race-built helpers at once on a loaded machine
	s := newSupervisor(t, spec)
	mustStart(t, s)

	// The no-drain time: these old workers exit at once on SIGTERM.
	quickOld := currentWorkers(s)
	slow := slowDrainSpec(spec, time.Minute, 0) // past stop_timeout: killed
	t0 := time.Now()
	if err := s.Reload(slow, Rolling, nil); err != nil {
		t.Fatalf("Reload (no drain): %v", err)
	}
	quick := time.Since(t0)
	for _, w := range quickOld {
		waitChan(t, "a quick old worker to exit", w.Done())
	}

	old := currentWorkers(s)
	capacity := watchCapacity(s)
	var rec recorder
	next := nextSpec(slow, "serve-ready")
	t0 = time.Now()
	err := s.Reload(next, Rolling, rec.add)
	took := time.Since(t0)
	st := s.Status()
	if err != nil {
		t.Fatalf("Reload (long drains): %v", err)
	}
	t.Logf("reload of %d workers: %s with old workers that exit at once, %s with old workers draining past stop_timeout %s",
		n, quick.Round(time.Millisecond), took.Round(time.Millisecond), spec.StopTimeout)
	if took > quick+spec.StopTimeout {
		t.Errorf("the reload took %s with long drains, %s without: it waited for the drains", took, quick)
	}

	// Right after the reload every slot runs the new release, and the old
	// workers show as draining.
	draining := map[int]bool{}
	for _, w := range st.Draining {
		if w.State == Draining {
			draining[w.PID] = true
		}
	}
	ready := 0
	for _, w := range st.Workers {
		if w.State == Ready && w.Release == next.Release {
			ready++
		}
	}
	if st.State != AppRunning || st.Release != next.Release || ready != n || len(st.Workers) != n {
		t.Errorf("after the reload: state %s release %s, %d ready of %s: %+v", st.State, st.Release, ready, next.Release, st.Workers)
	}
	socks := listenerInodes(spec)
	for _, w := range old {
		if !draining[w.PID] && !isClosed(w.Done()) {
			t.Errorf("old worker %d (pid %d) is neither draining in status nor gone: %+v", w.Slot, w.PID, st.Workers)
		}
		if holdsListener(w.PID, socks) {
			t.Errorf("old worker %d (pid %d) still holds the listener after the reload", w.Slot, w.PID)
		}
	}

	// Each old worker is killed stop_timeout after it was told to drain.
	starts := drainStarts(&rec)
	for _, w := range old {
		waitChan(t, "an old worker to end", w.Done())
		at, ok := starts[w.PID]
		w.mu.Lock()
		after := w.exitedAt.Sub(at)
		w.mu.Unlock()
		if !ok || w.ExitDescription() != "signal: killed" || after < spec.StopTimeout-50*time.Millisecond ||
			after > spec.StopTimeout+2*time.Second {
			t.Errorf("old worker %d (pid %d): %q %s after its drain began (event seen: %v), want killed at stop_timeout %s",
				w.Slot, w.PID, w.ExitDescription(), after, ok, spec.StopTimeout)
		}
	}
	if fewest := capacity(); fewest < n {
		t.Errorf("%d ready workers at one point of the reload, want at least %d", fewest, n)
	}
	waitFor(t, "no draining worker in status", func() bool { return len(s.Status().Draining) == 0 })
}

// waitDrained waits until s has no background drain left: a test that
// checks what an operation left behind calls it first.
func waitDrained(t testing.TB, s *Supervisor) {
	t.Helper()
	waitFor(t, "the old workers to drain", func() bool {
		n := 0
		s.read(func(st *state) { n = len(st.draining) })
		return n == 0
	})
}

// settledSteps is r.steps without the exited events: an old worker's drain
// ends in the background, before or after the operation's next steps (or
// after the operation, unreported).
func (r *recorder) settledSteps() []string {
	return slices.DeleteFunc(r.steps(), func(s string) bool { return strings.HasPrefix(s, "exited/") })
}

// countEvents counts the events of kind on ch until the returned func is
// called.
func countEvents(s *Supervisor, kind EventKind) func() int {
	events, cancel := s.Subscribe()
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			if e.Type == kind {
				n++
			}
		}
	}()
	return func() int {
		cancel()
		<-done
		return n
	}
}

// A second reload, scaling up and down, all while old workers drain in the
// background; a draining worker that is killed, or exits 1, is no crash;
// Stop waits for the drains, each bounded by its own stop_timeout.
func TestOperationsDuringBackgroundDrains(t *testing.T) {
	t.Parallel()
	spec := slowDrainSpec(testSpec(t, newListener(t), "serve-ready", 2), time.Minute, 0)
	spec.StopTimeout = 3 * time.Second
	spec.ReadyTimeout = waitTimeout
	s := newSupervisor(t, spec)
	mustStart(t, s)
	crashes := countEvents(s, EventCrash)
	v1 := currentWorkers(s)

	v2 := slowDrainSpec(spec, 300*time.Millisecond, 1) // drains a little, then exits 1
	if err := s.Reload(v2, Rolling, nil); err != nil {
		t.Fatalf("Reload to v2: %v", err)
	}
	mid := currentWorkers(s)
	v3 := nextSpec(v2, "serve-ready")
	if err := s.Reload(v3, BlueGreen, nil); err != nil {
		t.Fatalf("Reload to v3 while v1 drains: %v", err)
	}
	if err := s.Scale(3, nil); err != nil {
		t.Fatalf("Scale to 3 while workers drain: %v", err)
	}
	if err := s.Scale(1, nil); err != nil {
		t.Fatalf("Scale to 1 while workers drain: %v", err)
	}
	st := s.Status()
	if st.State != AppRunning || st.Instances != 1 || st.Release != v3.Release {
		t.Errorf("after the operations: %+v", st)
	}
	for _, w := range mid {
		waitChan(t, "a v2 worker to drain", w.Done())
		if d := w.ExitDescription(); d != "exit status 1" {
			t.Errorf("v2 worker %d (pid %d) ended with %q, want exit status 1 after its drain", w.Slot, w.PID, d)
		}
	}

	t0 := time.Now()
	s.Stop()
	if d := time.Since(t0); d > spec.StopTimeout+2*time.Second {
		t.Errorf("Stop took %s: it did not keep the drains' own stop_timeout %s", d, spec.StopTimeout)
	}
	for _, w := range v1 {
		if !isClosed(w.Done()) || w.ExitDescription() != "signal: killed" {
			t.Errorf("v1 worker %d (pid %d) after Stop: %q, want killed at its stop_timeout", w.Slot, w.PID, w.ExitDescription())
		}
	}
	if n := crashes(); n != 0 {
		t.Errorf("%d crash events: the exit of a draining worker is no crash", n)
	}
	if st := s.Status(); st.Restarts != 0 || len(st.Workers) != 0 || len(st.Draining) != 0 {
		t.Errorf("after Stop: restarts %d, workers %+v, draining %+v", st.Restarts, st.Workers, st.Draining)
	}
}

// An agent upgrade during background drains hands over the slots' current
// workers; the old agent keeps the draining ones until they are gone
// (Release waits for them), and does not touch those it handed over.
func TestHandOverDuringBackgroundDrains(t *testing.T) {
	t.Parallel()
	spec := slowDrainSpec(testSpec(t, newListener(t), "serve-ready", 2), time.Minute, 0)
	spec.StopTimeout = 3 * time.Second
	spec.ReadyTimeout = waitTimeout
	old := New(Options{App: "web", Shim: testBinary(t)}, spec)
	t.Cleanup(old.Stop)
	mustStart(t, old)
	drainers := currentWorkers(old)
	v2 := nextSpec(spec, "ticker")
	if err := old.Reload(v2, Rolling, nil); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	current := currentWorkers(old)

	hs, err := old.HandOver()
	if err != nil || len(hs) != 2 {
		t.Fatalf("HandOver during drains: %d workers, %v; want the 2 current ones", len(hs), err)
	}
	for i, h := range hs {
		if h.PID != current[i].PID {
			t.Errorf("handed over pid %d for slot %d, want the current %d", h.PID, i, current[i].PID)
		}
	}
	got := handOverTo(t, hs)
	old.Release()
	for _, w := range drainers {
		if !isClosed(w.Done()) || w.ExitDescription() != "signal: killed" {
			t.Errorf("draining worker %d (pid %d) after Release: %q, want waited for (killed at stop_timeout)",
				w.Slot, w.PID, w.ExitDescription())
		}
	}
	for _, w := range current {
		if processGone(w.PID) {
			t.Fatalf("handed-over worker %d stopped by Release", w.PID)
		}
	}

	next := newSupervisor(t, v2)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if after := pids(currentWorkers(next)); !slices.Equal(after, pids(current)) {
		t.Errorf("adopted %v, want %v", after, pids(current))
	}
	next.Stop()
	for _, w := range current {
		waitFor(t, "an adopted worker to be gone", func() bool { return processGone(w.PID) })
	}
}

func init() {
	// hold-conns is ready and accepts on fd 3, writing "held\n" to each
	// connection and keeping it until the client closes it; on SIGTERM it
	// stops accepting and exits once its last connection is closed.
	helpers["hold-conns"] = func() int {
		term := notifyTerm()
		l, err := net.FileListener(os.NewFile(3, "listener"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		var open sync.WaitGroup
		accepting := make(chan struct{})
		go func() {
			defer close(accepting)
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				open.Add(1)
				go func() {
					defer open.Done()
					defer c.Close()
					if _, err := c.Write([]byte("held\n")); err == nil {
						io.Copy(io.Discard, c)
					}
				}()
			}
		}()
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		<-term
		l.Close()
		unix.Close(3)
		<-accepting
		open.Wait()
		return 0
	}
}

// Status counts the connections each draining worker still holds on the
// app's listeners (a sock_diag dump matched to its /proc/PID/fd), and the
// count falls as they close; the worker ends with its last one.
func TestDrainingWorkerConnections(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, newListener(t), "hold-conns", 1)
	spec.StopTimeout = time.Minute // the drain ends with the connections, not by a kill
	spec.Env = append(spec.Env, "HELPER_LIFETIME=90s")
	s := newSupervisor(t, spec)
	mustStart(t, s)
	addr, err := spec.Listeners[0].LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, waitTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(waitTimeout))
		if line, err := bufio.NewReader(c).ReadString('\n'); line != "held\n" {
			t.Fatalf("the worker's greeting: %q %v", line, err)
		}
		conns = append(conns, c)
	}
	old := currentWorkers(s)[0]
	if err := s.Reload(nextSpec(spec, "serve-ready"), Rolling, nil); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	held := func() int {
		st := s.Status()
		for _, w := range st.Workers {
			if w.Connections != nil {
				t.Errorf("worker %d (%s) carries a connection count: only draining ones do", w.PID, w.State)
			}
		}
		if len(st.Draining) != 1 || st.Draining[0].PID != old.PID || st.Draining[0].Connections == nil {
			return -1
		}
		return *st.Draining[0].Connections
	}
	// Connections the new worker has not accepted yet (serve-ready does
	// not accept) are on the same port, and not the old worker's.
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, waitTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	if n := held(); n != 3 {
		t.Fatalf("the draining worker holds %d connections in status, want 3: %+v", n, s.Status().Draining)
	}
	conns[0].Close()
	waitFor(t, "2 connections on the draining worker", func() bool { return held() == 2 })
	conns[1].Close()
	conns[2].Close()
	waitChan(t, "the old worker to end with its last connection", old.Done())
	waitDrained(t, s)
}
