package workers

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/handoff"
)

func init() {
	// answer-unready-1 is answer, except in slot 1, where it serves
	// without ever reporting readiness.
	helpers["answer-unready-1"] = func() int { return serveAnswers(os.Getenv("DEPLOYD_WORKER") != "1") }
}

// answered is one request of timedLoad: when it was sent, when its answer
// came, from which client address and pid.
type answered struct {
	sent, got time.Time
	src       string
	pid       int
}

// timedLoad asks addr in a loop from one client per address of srcs, a
// new connection per request, until each client has sent 50 more requests
// after stop was closed, or max requests in all; it returns every answer
// and the failures.
func timedLoad(addr string, srcs []string, max int, stop <-chan struct{}) ([]answered, []error) {
	var mu sync.Mutex
	var out []answered
	var failed []error
	var wg sync.WaitGroup
	for _, src := range srcs {
		wg.Go(func() {
			extra := 50
			for range max / len(srcs) {
				if isClosed(stop) {
					if extra == 0 {
						return
					}
					extra--
				}
				sent := time.Now()
				pid, err := ask(addr, src)
				got := time.Now()
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
				} else {
					out = append(out, answered{sent: sent, got: got, src: src, pid: pid})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out, failed
}

// TestBlueGreenSwitchesEveryPositionAtOnce: on a steered pool a blue-green
// reload keeps its ready new workers out of the map (status: ready,
// spare) through the bake, then gives them every position in one update
// before any old worker is told to stop: no answer from a new worker came
// before the cutover event's time, no connection sent after the first
// old worker's draining event reached an old worker, and each sticky
// client moved once, from one old worker to one new one.
func TestBlueGreenSwitchesEveryPositionAtOnce(t *testing.T) {
	for _, b := range []string{handoff.BalanceEven, handoff.BalanceSticky} {
		t.Run(b, func(t *testing.T) {
			l, addr := steeredListener(t, b)
			spec := testSpec(t, l, "answer", 3)
			s := newSupervisor(t, spec)
			mustStart(t, s)
			olds := pids(currentWorkers(s))
			next := nextSpec(spec, "answer")
			next.MinReady = 300 * time.Millisecond // new workers wait ready this long
			srcs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"}
			stop := make(chan struct{})
			var samples []answered
			var failed []error
			done := make(chan struct{})
			go func() { defer close(done); samples, failed = timedLoad(addr, srcs, 200000, stop) }()
			var events []Event
			var spares []WorkerStatus
			err := s.Reload(next, BlueGreen, func(e Event) {
				events = append(events, e)
				if e.Type == EventReady && countKind(events, EventReady) == 3 {
					for _, w := range s.Status().Workers {
						if w.Release == next.Release {
							spares = append(spares, w)
						}
					}
				}
			})
			close(stop)
			<-done
			if err != nil {
				t.Fatalf("reload: %v", err)
			}
			if len(failed) > 0 {
				t.Fatalf("%d requests failed: %v", len(failed), failed[:min(5, len(failed))])
			}
			for _, w := range spares {
				if w.State != Ready || !w.Spare {
					t.Errorf("new worker %d while the reload waited: state %s, spare %v; want ready, spare", w.PID, w.State, w.Spare)
				}
			}
			if len(spares) != 3 {
				t.Errorf("status listed %d new workers once all were ready, want 3", len(spares))
			}
			checkCutover(t, events, samples, olds, pids(currentWorkers(s)), b == handoff.BalanceSticky)
		})
	}
}

func countKind(es []Event, k EventKind) int {
	n := 0
	for _, e := range es {
		if e.Type == k {
			n++
		}
	}
	return n
}

// checkCutover checks the answers of a load through a blue-green reload
// from the pool olds to the pool news against its events.
func checkCutover(t *testing.T, events []Event, samples []answered, olds, news []int, sticky bool) {
	t.Helper()
	var cut, drain, lastReady time.Time
	for _, e := range events {
		switch {
		case e.Type == EventCutover && cut.IsZero():
			cut = e.Time
		case e.Type == EventDraining && drain.IsZero():
			drain = e.Time
		case e.Type == EventReady && e.Time.After(lastReady):
			lastReady = e.Time
		}
	}
	if drain.IsZero() {
		t.Fatalf("no draining event: %v", events)
	}
	if cut.IsZero() {
		t.Errorf("no cutover event: %v", events)
		cut = drain // the checks below still say what answered when
	}
	if cut.Before(lastReady) || drain.Before(cut) {
		t.Errorf("cutover at %s, last new worker ready at %s, first drain at %s: want ready ≤ cutover ≤ drain",
			cut.Format(time.StampMicro), lastReady.Format(time.StampMicro), drain.Format(time.StampMicro))
	}
	byOld, byNew := 0, 0
	var wrong []string
	homes := map[string][]int{}
	slices.SortFunc(samples, func(a, b answered) int { return a.sent.Compare(b.sent) })
	for _, a := range samples {
		switch {
		case slices.Contains(olds, a.pid):
			byOld++
			if a.sent.After(drain) {
				wrong = append(wrong, fmt.Sprintf("old worker %d answered a connection sent %s after the first drain began", a.pid, a.sent.Sub(drain)))
			}
		case slices.Contains(news, a.pid):
			byNew++
			if a.got.Before(cut) {
				wrong = append(wrong, fmt.Sprintf("new worker %d answered %s before the cutover", a.pid, cut.Sub(a.got)))
			}
		default:
			t.Errorf("pid %d answered; pools %v → %v", a.pid, olds, news)
		}
		if h := homes[a.src]; len(h) == 0 || h[len(h)-1] != a.pid {
			homes[a.src] = append(h, a.pid)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d answers on the wrong side of the cutover, e.g.:\n%s", len(wrong), len(samples), strings.Join(wrong[:min(5, len(wrong))], "\n"))
	}
	if byOld == 0 || byNew == 0 {
		t.Errorf("%d answers by the old pool, %d by the new: the load did not span the cutover", byOld, byNew)
	}
	if sticky {
		for src, h := range homes {
			if len(h) != 2 || !slices.Contains(olds, h[0]) || !slices.Contains(news, h[1]) {
				t.Errorf("client %s was answered by %v in turn; want one old worker, then one new", src, h)
			}
		}
	}
	t.Logf("%d answers by the old pool, %d by the new; cutover %s after the last ready, first drain %s after the cutover",
		byOld, byNew, cut.Sub(lastReady), drain.Sub(cut))
}

// TestBlueGreenNotReadyWorkerSwitchesNothing: a new worker that serves
// but never gets ready abandons the reload; the new workers, ready ones
// included, never got a connection, and no cutover happened.
func TestBlueGreenNotReadyWorkerSwitchesNothing(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer", 3)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	olds := pids(currentWorkers(s))
	next := nextSpec(spec, "answer-unready-1")
	next.ReadyTimeout = time.Second
	stop := make(chan struct{})
	var samples []answered
	var failed []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		samples, failed = timedLoad(addr, []string{"127.0.0.2", "127.0.0.3"}, 100000, stop)
	}()
	var events []Event
	err := s.Reload(next, BlueGreen, func(e Event) { events = append(events, e) })
	close(stop)
	<-done
	var ab *AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("reload: %v; want abandoned", err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d requests failed: %v", len(failed), failed[:min(5, len(failed))])
	}
	if n := countKind(events, EventCutover); n != 0 {
		t.Errorf("%d cutover events for an abandoned reload", n)
	}
	if got := pids(currentWorkers(s)); !slices.Equal(got, olds) {
		t.Errorf("after the abandon the pool is %v, want %v", got, olds)
	}
	for _, a := range samples {
		if !slices.Contains(olds, a.pid) {
			t.Errorf("pid %d (not of the old pool %v) answered", a.pid, olds)
		}
	}
	t.Logf("%d answers, all by the old pool; %s", len(samples), fmt.Sprint(ab))
}

// TestBlueGreenWithASpareAndAGrow: a blue-green reload from 2 serving
// workers and a spare to 3 and a spare switches the 3 new serving workers
// in at once; the new spare stays out of the map, the old ones stop, and
// a later blue-green reload (back to the first half of the map) and a
// rolling one still leave every serving worker answering.
func TestBlueGreenWithASpareAndAGrow(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer", 3)
	spec.Spares = 1
	s := newSupervisor(t, spec)
	mustStart(t, s)
	next := nextSpec(spec, "answer")
	next.Instances = 4
	for i, strategy := range []Strategy{BlueGreen, BlueGreen, Rolling} {
		var events []Event
		if err := s.Reload(next, strategy, func(e Event) { events = append(events, e) }); err != nil {
			t.Fatalf("reload %d: %v", i+1, err)
		}
		if n := countKind(events, EventCutover); n != map[Strategy]int{BlueGreen: 1, Rolling: 0}[strategy] {
			t.Errorf("reload %d (%s): %d cutover events", i+1, strategy, n)
		}
		st := s.Status()
		spare := spareOf(st)
		if st.Instances != 3 || st.Spares != 1 || spare == 0 {
			t.Fatalf("reload %d: %d instances, %d spares, spare %d; want 3, 1 and a ready spare", i+1, st.Instances, st.Spares, spare)
		}
		tl := load(addr, 1, 30, nil)
		now := pids(currentWorkers(s))
		if len(tl.failed) > 0 || len(tl.by) != 3 || tl.by[spare] != 0 {
			t.Fatalf("reload %d: answers %v (failed %v) from the pool %v: want the 3 serving workers, not the spare %d", i+1, tl.by, tl.failed, now, spare)
		}
		for pid := range tl.by {
			if !slices.Contains(now, pid) {
				t.Fatalf("reload %d: pid %d answered; the pool is %v", i+1, pid, now)
			}
		}
		next = nextSpec(next, "answer")
	}
}

// TestBlueGreenCanaryOnASteeredPool: a blue-green canary and its promote
// cannot switch the whole pool at once (the other workers keep their
// places); they move slot by slot, lose nothing, and leave every worker
// answering.
func TestBlueGreenCanaryOnASteeredPool(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	spec := testSpec(t, l, "answer", 3)
	s := newSupervisor(t, spec)
	mustStart(t, s)
	stop := make(chan struct{})
	var during *tally
	done := make(chan struct{})
	go func() { defer close(done); during = load(addr, 2, 100000, stop) }()
	var events []Event
	collect := func(e Event) { events = append(events, e) }
	err := s.ReloadCanary(nextSpec(spec, "answer"), BlueGreen, Canary{N: 1}, collect)
	if err == nil {
		_, err = s.Promote(collect)
	}
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("canary or promote: %v", err)
	}
	if len(during.failed) > 0 {
		t.Fatalf("%d requests failed: %v", len(during.failed), during.failed[:min(5, len(during.failed))])
	}
	if n := countKind(events, EventCutover); n != 0 {
		t.Errorf("%d cutover events for a canary and its promote", n)
	}
	// The operator is told why there was no cutover at once.
	notices := 0
	for _, e := range events {
		if e.Type == EventNotice && strings.Contains(e.Message, "one by one") && strings.Contains(e.Message, "canary") {
			notices++
		}
	}
	if notices == 0 {
		t.Errorf("no notice that the canary's workers switch one by one: %v", events)
	}
	now := pids(currentWorkers(s))
	tl := load(addr, 1, 30, nil)
	if len(tl.failed) > 0 || len(tl.by) != 3 {
		t.Fatalf("answers %v (failed %v); want all 3 of %v", tl.by, tl.failed, now)
	}
	for pid := range tl.by {
		if !slices.Contains(now, pid) {
			t.Fatalf("pid %d answered; the pool is %v", pid, now)
		}
	}
}
