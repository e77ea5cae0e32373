package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// racyFlip refuses its first `refusals` upgrade requests with tableflip's "parent
// hasn't exited", as its run loop does when it takes the request before
// the parent's exit; parentDone is what WaitForParent reports.
type racyFlip struct {
	refusals, calls int
	parentDone      bool
}

func (f *racyFlip) Upgrade() error {
	f.calls++
	if f.calls <= f.refusals {
		return errors.New(errParentRunning)
	}
	return nil
}

func (f *racyFlip) WaitForParent(ctx context.Context) error {
	if f.parentDone {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestUpgradeAsksAgainOnceTheParentIsGone(t *testing.T) {
	f := &racyFlip{refusals: 3, parentDone: true}
	if err := upgradeOnceParentGone(f, time.Second); err != nil {
		t.Fatalf("upgrade after tableflip's stale refusals: %v", err)
	}
	if f.calls != 4 {
		t.Errorf("Upgrade called %d times, want 4 (3 refusals, then the handoff)", f.calls)
	}
}

func TestUpgradeRefusedWhileTheParentRuns(t *testing.T) {
	f := &racyFlip{refusals: 1000, parentDone: false}
	err := upgradeOnceParentGone(f, time.Second)
	if err == nil || err.Error() != errParentRunning {
		t.Fatalf("got %v, want tableflip's refusal: the parent still runs", err)
	}
	if f.calls != 1 {
		t.Errorf("Upgrade called %d times while the parent runs, want 1", f.calls)
	}
}

func TestUpgradeRetryIsBounded(t *testing.T) {
	f := &racyFlip{refusals: 1 << 30, parentDone: true}
	start := time.Now()
	if err := upgradeOnceParentGone(f, 50*time.Millisecond); err == nil || err.Error() != errParentRunning {
		t.Fatalf("got %v, want the refusal once the bound passed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v, want about the 50ms bound", d)
	}
}
