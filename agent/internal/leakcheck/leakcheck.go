// Package leakcheck fails a package's tests when they leave a goroutine or
// a file descriptor behind: TestMain returns Run(m) as its exit code.
package leakcheck

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Run runs the tests and then checks that no goroutine (goleak) and no
// file descriptor more than before is left; it returns the exit code.
func Run(m *testing.M) int {
	// The runtime's poller (an epoll and an eventfd) is made once, at the
	// first pollable file: make it now, so that it is not counted as a leak.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := countFDs()
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		println("goroutine leak:", err.Error())
		return 1
	}
	if after := countFDs(); after > before {
		println("file descriptor leak:", before, "before the tests,", after, "after")
		return 1
	}
	return 0
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}
