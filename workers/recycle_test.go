package workers

import (
	"testing"
	"time"
)

func TestRecycleDueJitter(t *testing.T) {
	const after = 10 * time.Second
	t0 := time.Now()
	spread := map[time.Duration]bool{}
	for pid := 100; pid < 140; pid++ {
		w := &Worker{PID: pid, Started: t0}
		if recycleDue(after, w, t0.Add(after-time.Millisecond)) {
			t.Fatalf("pid %d due before recycle_after", pid)
		}
		if !recycleDue(after, w, t0.Add(after+after/10+time.Millisecond)) {
			t.Fatalf("pid %d not due after recycle_after and its largest jitter", pid)
		}
		for d := after; d <= after+after/10; d += 100 * time.Millisecond {
			if recycleDue(after, w, t0.Add(d)) {
				spread[d] = true
				break
			}
		}
	}
	if len(spread) < 5 {
		t.Errorf("40 workers started together fall due at %d distinct times, want them spread", len(spread))
	}
	if recycleDue(0, &Worker{PID: 1, Started: t0}, t0.Add(time.Hour)) {
		t.Error("recycle_after 0 is off")
	}
}
