package workers

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/deployd/deployd/handoff"
)

// askAll starts n clients at once (from 127.0.0.2 up, so that sticky
// spreads them) and returns a channel of their outcomes.
func askAll(addr string, n int) <-chan error {
	out := make(chan error, n)
	for i := range n {
		go func() {
			_, err := ask(addr, fmt.Sprintf("127.0.0.%d", 2+i))
			out <- err
		}()
	}
	return out
}

func TestPausedConnectionsAreServedOnResume(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceSticky)
	s := newSupervisor(t, testSpec(t, l, "answer", 2))
	mustStart(t, s)
	if err := s.PauseConnections(0); err != nil {
		t.Fatal(err)
	}
	const n = 10
	outcomes := askAll(addr, n)
	waitFor(t, "10 connections waiting in the pause", func() bool {
		p := s.Status().Paused
		return p != nil && p.Queued == n
	})
	select {
	case err := <-outcomes:
		t.Fatalf("a client got an outcome while paused: %v", err)
	default:
	}
	s.ResumeConnections()
	for i := range n {
		select {
		case err := <-outcomes:
			if err != nil {
				t.Errorf("client %d after resume: %v", i, err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("only %d of %d clients answered after resume", i, n)
		}
	}
	if p := s.Status().Paused; p != nil {
		t.Errorf("status still paused after resume: %+v", p)
	}
}

func TestPauseEndsByItselfAtItsMaximum(t *testing.T) {
	l, addr := steeredListener(t, handoff.BalanceEven)
	s := newSupervisor(t, testSpec(t, l, "answer", 2))
	mustStart(t, s)
	const max = 300 * time.Millisecond
	t0 := time.Now()
	if err := s.PauseConnections(max); err != nil {
		t.Fatal(err)
	}
	if p := s.Status().Paused; p == nil || p.Until.IsZero() {
		t.Fatalf("status of a pause with a maximum: %+v", p)
	}
	outcomes := askAll(addr, 4)
	for i := range 4 {
		select {
		case err := <-outcomes:
			if err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
			if d := time.Since(t0); d < max {
				t.Fatalf("client %d answered after %v, before the pause's %v ended", i, d, max)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("the pause did not end by itself (%d answered)", i)
		}
	}
}

func TestPauseOfASharedAppIsRefused(t *testing.T) {
	s := newSupervisor(t, testSpec(t, newListener(t), "serve-ready", 1))
	mustStart(t, s)
	if err := s.PauseConnections(0); !errors.Is(err, ErrPauseNeedsSteering) {
		t.Fatalf("PauseConnections on a shared app: %v, want ErrPauseNeedsSteering", err)
	}
}
