package control

import (
	"os"
	"testing"

	"github.com/deployd/deployd/agent/internal/leakcheck"
)

// TestMain fails the package's tests if any of them leaves a goroutine or
// a file descriptor behind.
func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }
