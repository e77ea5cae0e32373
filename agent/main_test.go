package agent

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any of them leaves a goroutine or a
// file descriptor behind.
func TestMain(m *testing.M) {
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
