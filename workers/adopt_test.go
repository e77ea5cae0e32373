package workers

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
)

// handOverTo passes hs through a real handover channel, as to a next agent.
func handOverTo(t *testing.T, hs []*Handover) []*Handover {
	t.Helper()
	mine, theirs, err := handoff.NewHandoverChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	var ps []handoff.Parcel
	for _, h := range hs {
		b, _ := json.Marshal(h)
		ps = append(ps, handoff.Parcel{Header: b, Files: h.Files()})
	}
	sent := make(chan error, 1)
	go func() { sent <- handoff.SendParcels(mine, ps, time.Now().Add(5*time.Second)) }()
	got, err := handoff.ReceiveParcels(theirs, time.Now().Add(5*time.Second))
	if err != nil || <-sent != nil {
		t.Fatalf("handover: %v", err)
	}
	for _, h := range hs {
		h.ReleaseFiles()
	}
	var out []*Handover
	for _, p := range got {
		var h Handover
		if err := json.Unmarshal(p.Header, &h); err != nil {
			t.Fatal(err)
		}
		h.SetFiles(p.Files)
		out = append(out, &h)
	}
	return out
}

var tickLine = regexp.MustCompile(`^tick (\d+)$`)

// ticksOf returns the tick numbers in lines.
func ticksOf(lines []string) []int {
	var out []int
	for _, l := range lines {
		if m := tickLine.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
	}
	return out
}

func TestHandOverAndAdoptKeepTheProcessAndItsOutput(t *testing.T) {
	spec := testSpec(t, newListener(t), "ticker", 2)
	old := New(Options{App: "web", Shim: testBinary(t)}, spec)
	mustStart(t, old)
	before := pids(currentWorkers(old))
	waitFor(t, "ticks", func() bool { return len(ticksOf(currentWorkers(old)[0].LastLines())) > 3 })

	hs, err := old.HandOver()
	if err != nil || len(hs) != 2 {
		t.Fatalf("HandOver: %d workers, %v", len(hs), err)
	}
	if err := old.Reload(nextSpec(spec, "ticker"), Rolling, nil); err == nil {
		t.Error("a reload during a handover was admitted")
	}
	got := handOverTo(t, hs)
	old.Release()
	for _, pid := range before {
		if processGone(pid) {
			t.Fatalf("worker %d stopped by Release", pid)
		}
	}

	next := newSupervisor(t, spec)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	ws := currentWorkers(next)
	if after := pids(ws); after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("adopted %v, want %v", after, before)
	}
	// Output goes on, continuing the numbering, and so do notify messages.
	waitFor(t, "ticks read by the adopter", func() bool { return len(ticksOf(ws[0].LastLines())) > 3 })
	if first := ticksOf(ws[0].LastLines())[0]; first <= 3 {
		t.Errorf("the adopter's first tick is %d: the numbering restarted", first)
	}
	s0 := next.Status().Workers[0].Status
	waitFor(t, "a new STATUS= through the adopted notify socket", func() bool {
		s := next.Status().Workers[0].Status
		return strings.HasPrefix(s, "tick ") && s != s0
	})
	if st := next.Status(); st.State != AppRunning || st.Workers[0].State != Ready || st.Workers[0].Uptime < 20*time.Millisecond {
		t.Errorf("status after adoption: %+v", st)
	}
	// Stop uses the pidfd: the process exits, its status unknown here.
	next.Stop()
	for _, pid := range before {
		waitFor(t, "adopted worker gone", func() bool { return processGone(pid) })
	}
	if d := ws[0].ExitDescription(); d != errAdoptedExit.Error() {
		t.Errorf("exit description %q", d)
	}
}

func TestAdoptRefusesAnotherProcess(t *testing.T) {
	spec := testSpec(t, newListener(t), "ticker", 1)
	old := newSupervisor(t, spec)
	mustStart(t, old)
	hs, err := old.HandOver()
	if err != nil {
		t.Fatal(err)
	}
	got := handOverTo(t, hs)
	got[0].StartTime++ // as if the pid had been reused
	old.Resume()
	next := newSupervisor(t, spec)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if p := pids(currentWorkers(next)); p[0] == pids(currentWorkers(old))[0] {
		t.Fatalf("adopted pid %d despite another start time", p[0])
	}
}

func TestAdoptNodeIPCWorker(t *testing.T) {
	spec := testSpec(t, newListener(t), "node-ipc-ready", 1)
	spec.Ready = ReadyPolicy{Mode: ReadyNodeIPC}
	old := New(Options{App: "web", Shim: testBinary(t)}, spec)
	mustStart(t, old)
	before := pids(currentWorkers(old))
	hs, err := old.HandOver()
	if err != nil || len(hs) != 1 || !slices.Contains(hs[0].Streams, "ipc") {
		t.Fatalf("HandOver: %+v, %v", hs, err)
	}
	got := handOverTo(t, hs)
	old.Release()
	next := newSupervisor(t, spec)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if after := pids(currentWorkers(next)); after[0] != before[0] {
		t.Fatalf("adopted %v, want %v", after, before)
	}
	next.Stop()
	waitFor(t, "adopted worker gone", func() bool { return processGone(before[0]) })
}

// lastTick is the highest tick w's reader has read.
func lastTick(w *Worker) int {
	ts := ticksOf(w.LastLines())
	if len(ts) == 0 {
		return 0
	}
	return ts[len(ts)-1]
}

// unread is how many bytes wait in the pipe f reads (FIONREAD, which is
// TIOCINQ on Linux).
func unread(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || ierr != nil {
		t.Fatalf("FIONREAD: %v %v", err, ierr)
	}
	return n
}

// A new agent that gives up (LetGo) stops reading the workers it adopted
// before the previous agent reads them again: only one agent reads a pipe,
// and the previous one reads on from the first line the other did not.
func TestLetGoStopsReadingAdoptedWorkers(t *testing.T) {
	spec := testSpec(t, newListener(t), "ticker", 1)
	old := newSupervisor(t, spec)
	mustStart(t, old)
	mine := currentWorkers(old)[0]
	hs, err := old.HandOver()
	if err != nil || len(hs) != 1 {
		t.Fatalf("HandOver: %d workers, %v", len(hs), err)
	}
	got := handOverTo(t, hs)
	next := newSupervisor(t, spec)
	if err := next.Adopt(got); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	adopted := currentWorkers(next)[0]
	n0 := lastTick(adopted)
	waitFor(t, "ticks read by the adopter", func() bool { return lastTick(adopted) > n0+2 })
	next.LetGo()
	frozen := lastTick(adopted)
	// Nobody reads now: the worker's lines wait in its pipe.
	waitFor(t, "lines waiting in the pipe after LetGo", func() bool { return unread(t, mine.ends["out"]) >= 5*len("tick 100\n") })
	old.Resume()
	waitFor(t, "ticks read again by the previous agent", func() bool { return lastTick(mine) > frozen+5 })
	if n := lastTick(adopted); n != frozen {
		t.Errorf("the agent that let go read on: its last tick went from %d to %d", frozen, n)
	}
	if !slices.Contains(ticksOf(mine.LastLines()), frozen+1) {
		t.Errorf("the previous agent read on from %v, want tick %d first: lines lost", ticksOf(mine.LastLines()), frozen+1)
	}
	if processGone(mine.PID) {
		t.Errorf("worker %d stopped by LetGo", mine.PID)
	}
}

// roundTrip passes pool through JSON, as the handover channel does.
func roundTrip(t *testing.T, pool *PoolHandover) *PoolHandover {
	t.Helper()
	b, err := json.Marshal(pool)
	if err != nil {
		t.Fatal(err)
	}
	var out PoolHandover
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// A crash-looping pool is taken over as it is: no readiness is waited for,
// its counters and last exit carry over, and it goes on restarting under
// the next supervisor with the backoff it had.
func TestAdoptPoolKeepsACrashLoop(t *testing.T) {
	spec := testSpec(t, newListener(t), "exit-now", 1)
	spec.Restart = RestartPolicy{Backoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		MaxRestarts: 1000, Window: time.Minute, StableAfter: 10 * time.Second}
	old := New(Options{App: "bad", Shim: testBinary(t)}, spec)
	_ = old.Start() // not ready: it crash-loops
	waitFor(t, "3 restarts", func() bool { return old.Status().Restarts >= 3 })
	pool, hs, err := old.HandOverPool()
	if err != nil {
		t.Fatalf("HandOverPool: %v", err)
	}
	if pool.Healthy || pool.State != AppRunning || len(pool.Slots) != 1 || pool.Slots[0].Restarts < 3 ||
		pool.Slots[0].Backoff <= spec.Restart.Backoff || len(pool.Slots[0].Crashes) < 3 || pool.LastExit == "" {
		t.Fatalf("pool handed over: %+v", pool)
	}
	got := handOverTo(t, hs)
	before := old.Status()
	old.Release()
	next := newSupervisor(t, spec)
	t0 := time.Now()
	if err := next.AdoptPool(roundTrip(t, pool), got); err != nil {
		t.Fatalf("AdoptPool: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("AdoptPool took %v: it waited for a crash-looping worker", d)
	}
	st := next.Status()
	if st.State != AppRunning || st.Restarts < before.Restarts || st.LastExit == "" {
		t.Errorf("after adoption: state %s, restarts %d (before %d), last exit %q", st.State, st.Restarts, before.Restarts, st.LastExit)
	}
	waitFor(t, "restarts under the next supervisor", func() bool { return next.Status().Restarts >= before.Restarts+2 })
}

// An errored pool stays errored: same counters and last exit, and no
// worker is started.
func TestAdoptPoolKeepsAnErroredApp(t *testing.T) {
	spec := testSpec(t, newListener(t), "exit-now", 1)
	spec.Restart.MaxRestarts = 2
	old := New(Options{App: "bad", Shim: testBinary(t)}, spec)
	_ = old.Start()
	waitFor(t, "errored", func() bool { return old.Status().State == AppErrored })
	pool, hs, err := old.HandOverPool()
	if err != nil || len(hs) != 0 {
		t.Fatalf("HandOverPool: %d workers, %v", len(hs), err)
	}
	before := old.Status()
	old.Release()
	next := newSupervisor(t, spec)
	if err := next.AdoptPool(roundTrip(t, pool), nil); err != nil {
		t.Fatalf("AdoptPool: %v", err)
	}
	st := next.Status()
	if st.State != AppErrored || st.Restarts != before.Restarts || st.LastExit != before.LastExit ||
		!slices.Equal(st.LastLines, before.LastLines) {
		t.Errorf("after adoption: %s, restarts %d, last exit %q, lines %q; before: %s, %d, %q, %q",
			st.State, st.Restarts, st.LastExit, st.LastLines, before.State, before.Restarts, before.LastExit, before.LastLines)
	}
	if ps := next.Processes(); len(ps) != 0 {
		t.Errorf("an errored app started workers: %+v", ps)
	}
}
