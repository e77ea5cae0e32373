package workers

import (
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// recycleDue reports whether w is due for recycling under spec at now.
func recycleDue(spec *Spec, w *Worker, now time.Time) bool {
	at, _ := recycleAt(spec, w)
	return !at.IsZero() && !now.Before(at)
}

func TestRecycleDueJitter(t *testing.T) {
	const after = 10 * time.Second
	t0 := time.Now()
	spread := map[time.Duration]bool{}
	for pid := 100; pid < 140; pid++ {
		w := &Worker{PID: pid, Started: t0}
		if recycleDue(&Spec{RecycleAfter: after}, w, t0.Add(after-time.Millisecond)) {
			t.Fatalf("pid %d due before recycle_after", pid)
		}
		if !recycleDue(&Spec{RecycleAfter: after}, w, t0.Add(after+after/10+time.Millisecond)) {
			t.Fatalf("pid %d not due after recycle_after and its largest jitter", pid)
		}
		for d := after; d <= after+after/10; d += 100 * time.Millisecond {
			if recycleDue(&Spec{RecycleAfter: after}, w, t0.Add(d)) {
				spread[d] = true
				break
			}
		}
	}
	if len(spread) < 5 {
		t.Errorf("40 workers started together fall due at %d distinct times, want them spread", len(spread))
	}
	if recycleDue(&Spec{}, &Worker{PID: 1, Started: t0}, t0.Add(time.Hour)) {
		t.Error("recycle_after 0 is off")
	}
}

// TestRecycleAtDuePastTheScheduledTime: with recycle_at, a worker is due
// once a time of the schedule has come since it started, every worker
// of a pool at the same time (no jitter: the monitor replaces one at a
// time), and a worker started after that time is not due until the next;
// with recycle_after too, the earlier of the two applies.
func TestRecycleAtDuePastTheScheduledTime(t *testing.T) {
	sched, err := cron.ParseStandard("CRON_TZ=UTC 0 4 * * *")
	if err != nil {
		t.Fatal(err)
	}
	spec := &Spec{RecycleAt: sched, RecycleAtText: "0 4 * * *"}
	day := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	four := day.Add(4 * time.Hour)
	for pid := 100; pid < 110; pid++ {
		w := &Worker{PID: pid, Started: day.Add(time.Duration(pid) * time.Minute)} // 01:40 to 01:49
		if recycleDue(spec, w, four.Add(-time.Second)) {
			t.Fatalf("pid %d due before 04:00", pid)
		}
		if !recycleDue(spec, w, four) {
			t.Fatalf("pid %d, started %s, not due at 04:00", pid, w.Started.Format(time.TimeOnly))
		}
		if at, by := recycleAt(spec, w); !at.Equal(four) || by != "recycle_at" {
			t.Fatalf("pid %d: due at %s by %q, want 04:00 by recycle_at", pid, at, by)
		}
	}
	replacement := &Worker{PID: 200, Started: four.Add(3 * time.Second)}
	if recycleDue(spec, replacement, four.Add(23*time.Hour)) {
		t.Error("a worker started after 04:00 is due again before the next 04:00")
	}
	if !recycleDue(spec, replacement, four.Add(24*time.Hour)) {
		t.Error("a worker started after 04:00 is not due at the next 04:00")
	}
	both := &Spec{RecycleAt: sched, RecycleAfter: time.Hour}
	w := &Worker{PID: 300, Started: four.Add(time.Minute)}
	if at, by := recycleAt(both, w); by != "recycle_after" || at.Before(w.Started.Add(time.Hour)) || at.After(w.Started.Add(66*time.Minute)) {
		t.Errorf("recycle_after 1h beside recycle_at: due at %s by %q, want an hour (and its jitter) after the start", at, by)
	}
	if at, by := recycleAt(both, &Worker{PID: 301, Started: four.Add(-time.Minute)}); by != "recycle_at" || !at.Equal(four) {
		t.Errorf("a worker started a minute before 04:00: due at %s by %q, want 04:00 by recycle_at", at, by)
	}
}
