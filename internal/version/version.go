// Package version owns the build's version string (set with -ldflags, or
// read from the module build info) and the VCS data Go embeds in a build.
package version

import (
	"runtime/debug"
	"strings"
)

// Version is set at build time with
// -ldflags "-X github.com/deployd/deployd/internal/version.Version=v1.2.3";
// otherwise it comes from the module's build info, or "dev".
var Version = ""

// String returns the version.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Build is what the Go toolchain recorded about the source a binary was
// built from (`go build` in a git checkout; empty under `go run` or -buildvcs=false).
type Build struct {
	Commit string // full revision
	Time   string // commit time, RFC 3339
	Dirty  bool   // the work tree had uncommitted changes
}

// VCS reads the build's VCS settings.
func VCS() Build {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Build{}
	}
	return vcsOf(bi.Settings)
}

func vcsOf(settings []debug.BuildSetting) Build {
	var b Build
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Dirty = s.Value == "true"
		}
	}
	return b
}

// Long returns the version followed by the commit, its date and a dirty
// mark when the build recorded them, e.g. "v1.2.3 (commit 08a2178c1e2f, 2026-12-01T21:00:00Z, dirty)";
// for a build that recorded neither, "dev" and how to get a stamped build.
func Long() string {
	return longOf(String(), VCS())
}

// unstamped follows "dev" in Long when the build recorded neither a version
// nor a commit (`go build` with -buildvcs=false, or from a source archive).
const unstamped = " (no version stamp: releases and `go install .../cmd/deployd@VERSION` have one)"

func longOf(v string, b Build) string {
	if b.Commit == "" {
		if v == "dev" {
			return v + unstamped
		}
		return v
	}
	commit := b.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if strings.Contains(v, commit) { // Go's pseudo-version already says it all
		return v
	}
	parts := []string{"commit " + commit}
	if b.Time != "" {
		parts = append(parts, b.Time)
	}
	if b.Dirty {
		parts = append(parts, "dirty")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}
