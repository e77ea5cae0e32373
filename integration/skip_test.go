package integration

import (
	"os"
	"testing"
)

// skipOrFail skips a test whose precondition (root, a tool, a kernel
// feature) is missing on this machine — but in CI (CI=true, which .ci/run
// exports) the machine is meant to have it, so there the skip is a failure:
// a silently skipped test would let its regression land.
func skipOrFail(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and this test cannot run: %s (CI must run it: fix the CI machine)", reason)
	}
	t.Skip(reason)
}
