package control

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any of them leaves a goroutine or
// a file descriptor behind.
func TestMain(m *testing.M) {
	// The runtime's poller is made once, at the first pollable file: now,
	// so that it is not counted as a leak.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	fds := func() int { ents, _ := os.ReadDir("/proc/self/fd"); return len(ents) }
	before := fds()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println("goroutine leak:", err.Error())
			code = 1
		}
		if after := fds(); after > before {
			println("file descriptor leak:", before, "before the tests,", after, "after")
			code = 1
		}
	}
	os.Exit(code)
}
