package version

import (
	"runtime/debug"
	"testing"
)

func TestLongNamesCommitDateAndDirty(t *testing.T) {
	settings := []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "08a2178c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b"},
		{Key: "vcs.time", Value: "2026-12-01T21:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	got := longOf("v1.2.3", vcsOf(settings))
	want := "v1.2.3 (commit 08a2178c1e2f, 2026-12-01T21:00:00Z, dirty)"
	if got != want {
		t.Fatalf("longOf = %q, want %q", got, want)
	}
	settings[3].Value = "false"
	if got, want := longOf("dev", vcsOf(settings)), "dev (commit 08a2178c1e2f, 2026-12-01T21:00:00Z)"; got != want {
		t.Fatalf("clean build: longOf = %q, want %q", got, want)
	}
	pseudo := "v0.0.0-20261201210000-08a2178c1e2f+dirty"
	if got := longOf(pseudo, vcsOf(settings)); got != pseudo {
		t.Fatalf("pseudo-version: longOf = %q, want it unchanged", got)
	}
	if got := longOf("dev", vcsOf(nil)); got != "dev"+unstamped {
		t.Fatalf("no VCS data: longOf = %q, want dev%s", got, unstamped)
	}
	if got := longOf("v1.2.3", vcsOf(nil)); got != "v1.2.3" { // -ldflags -X, or go install @v1.2.3
		t.Fatalf("stamped, no VCS data: longOf = %q, want v1.2.3", got)
	}
}
