package agent

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/deployd/deployd/handoff"
)

// TestMain fails the package's tests if any of them leaves a goroutine or a
// file descriptor behind.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == handoff.ShimArg { // a worker's shim
		os.Exit(handoff.RunShim(os.Args[2:]))
	}
	// The runtime's poller (an epoll and an eventfd) is made once, at the
	// first pollable file: make it now, so that it is not counted as a leak.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := countFDs()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println("goroutine leak:", err.Error())
			code = 1
		}
		if after := countFDs(); after > before {
			println("file descriptor leak:", before, "before the tests,", after, "after")
			code = 1
		}
	}
	os.Exit(code)
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}
