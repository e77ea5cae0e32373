package integration

import (
	"syscall"
	"testing"
	"time"
)

// AwaitExit fails t unless the agent Start started is gone within 10 s:
// after a SIGKILL, which nothing can hold up.
func (a *Agent) AwaitExit(t testing.TB) {
	t.Helper()
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("agent still running 10s after SIGKILL")
	}
}

// KillAndAwait SIGKILLs the agent Start started and waits until it is gone.
func (a *Agent) KillAndAwait(t testing.TB) {
	t.Helper()
	a.Signal(syscall.SIGKILL)
	a.AwaitExit(t)
}
