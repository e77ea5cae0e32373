package agent

import (
	"os"
	"testing"

	"github.com/deployd/deployd/agent/internal/leakcheck"
	"github.com/deployd/deployd/handoff"
)

// TestMain fails the package's tests if any of them leaves a goroutine or a
// file descriptor behind.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == handoff.ShimArg { // a worker's shim
		os.Exit(handoff.RunShim(os.Args[2:]))
	}
	os.Exit(leakcheck.Run(m))
}
