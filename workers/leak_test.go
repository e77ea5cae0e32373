package workers

import (
	"syscall"
	"testing"
)

// leakCycle runs a supervisor through start, a crash restart, a rolling
// reload to node-ipc readiness, an abandoned reload and stop.
func leakCycle(t *testing.T) {
	t.Helper()
	l := newListener(t)
	spec := testSpec(t, l, "serve-ready", 1)
	s := New(Options{App: "web", Shim: testBinary(t)}, spec)
	defer s.Stop()
	mustStart(t, s)

	old := currentWorkers(s)[0]
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the crashed worker to be restarted", func() bool {
		w := currentWorkers(s)[0]
		return w != old && isClosed(w.Ready())
	})

	spec2 := nextSpec(spec, "node-ipc-ready")
	spec2.Ready.Mode = "node-ipc"
	if err := s.Reload(spec2, Rolling, nil); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if err := s.Reload(nextSpec(spec2, "exit-now"), BlueGreen, nil); err == nil {
		t.Fatal("Reload to a crashing release succeeded")
	}
	s.Stop()
	l.Close()
}

// Every descriptor a supervisor opens (notify sockets, output pipes,
// node-ipc channels, pidfds) is closed again. Not parallel: the count is
// per process, and parallel tests only run after the sequential ones.
func TestNoDescriptorLeak(t *testing.T) {
	leakCycle(t) // warm up: the runtime opens some descriptors once (epoll, pidfd probe)
	before := fdCount(t)
	leakCycle(t)
	if after := fdCount(t); after != before {
		t.Errorf("%d descriptors open before a start/reload/stop cycle, %d after", before, after)
	}
}
