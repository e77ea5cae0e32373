package workers

import (
	"errors"
	"testing"
	"time"
)

// A claim holds the app for its caller: a second claim is refused with a
// *BusyError naming the first, the holder's own calls go through, and
// ClaimWait gets the app once the first claim ends. Once stopped, a claim
// is not recorded.
func TestClaimIsTheAppsOneBusyState(t *testing.T) {
	t.Parallel()
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 1))
	mustStart(t, s)
	release, err := s.Claim("deploy")
	if err != nil {
		t.Fatalf("first claim: %v", err)
	}
	var be *BusyError
	if _, err := s.Claim("scale"); !errors.As(err, &be) || be.Op != "deploy" || !errors.Is(err, ErrBusy) {
		t.Errorf("second claim: %v, want a *BusyError naming the deploy", err)
	}
	if c := s.Claimed(); c == nil || c.Op != "deploy" {
		t.Errorf("Claimed = %+v, want the deploy", c)
	}
	if err := s.Restart(nil); err != nil {
		t.Errorf("the holder's restart under its claim: %v", err)
	}
	got := make(chan func())
	go func() { got <- s.ClaimWait("after hook") }()
	select {
	case <-got:
		t.Fatal("ClaimWait got the app while the deploy held it")
	case <-time.After(50 * time.Millisecond): // it must not return: nothing to wait on
	}
	release()
	release() // twice is fine
	var second func()
	select {
	case second = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("ClaimWait did not get the app 10s after the claim ended")
	}
	if c := s.Claimed(); c == nil || c.Op != "after hook" {
		t.Errorf("Claimed = %+v, want the after hook", c)
	}
	second()
	if c := s.Claimed(); c != nil {
		t.Errorf("Claimed after every claim ended = %+v", c)
	}
	s.Stop()
	r1, err1 := s.Claim("late")
	r2, err2 := s.Claim("later")
	if err1 != nil || err2 != nil {
		t.Errorf("claims once stopped: %v, %v; want none recorded (every call fails with ErrCanceled)", err1, err2)
	} else {
		r1()
		r2()
	}
}
