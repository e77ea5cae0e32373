package workers

import (
	"testing"
	"time"
)

// A worker's waiter closes its ends only once no handoff holds them, and a
// handoff takes no worker whose ends are closing: else the next agent gets
// closed (or reused) descriptors, its handover is cut short, and the
// workers it did not get run on with no agent (seen with SIGKILLs during
// back-to-back upgrades).
func TestSealWaitsForTheHandoffAndRefusesALaterOne(t *testing.T) {
	p := newPauser(nil)
	if _, ok := p.pause(); !ok {
		t.Fatal("pause of a running worker's readers refused")
	}
	sealed := make(chan struct{})
	go func() { p.seal(); close(sealed) }()
	select {
	case <-sealed:
		t.Fatal("seal returned while a handoff holds the ends")
	case <-time.After(100 * time.Millisecond):
	}
	p.resume()
	select {
	case <-sealed:
	case <-time.After(5 * time.Second):
		t.Fatal("seal still waits after the handoff ended")
	}
	if _, ok := p.pause(); ok {
		t.Fatal("a handoff paused a worker whose ends are closing")
	}
}

func TestSealAfterReleaseReturns(t *testing.T) {
	p := newPauser(nil)
	p.pause()
	p.release()
	done := make(chan struct{})
	go func() { p.seal(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("seal waits after the handoff released the ends")
	}
}
