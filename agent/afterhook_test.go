package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// wait and close return only once every entered hook left; once closed,
// no hook enters.
func TestAfterHooksWaitAndClose(t *testing.T) {
	var h afterHooks
	if err := h.wait(context.Background()); err != nil {
		t.Fatalf("wait with no hook: %v", err)
	}
	if !h.enter() || !h.enter() {
		t.Fatal("enter refused before close")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with two hooks running = %v, want the context's deadline", err)
	}
	closed := make(chan struct{})
	go func() { h.close(); close(closed) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		h.mu.Lock()
		c := h.closed
		h.mu.Unlock()
		if c {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("close did not close")
		}
	}
	if h.enter() {
		t.Error("a hook entered after close")
	}
	h.leave()
	select {
	case <-closed:
		t.Fatal("close returned while a hook still ran")
	case <-time.After(50 * time.Millisecond): // it must not return: nothing to wait on
	}
	h.leave()
	<-closed
	h.close() // twice is fine
}
