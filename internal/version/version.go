// Package version owns the build's version string (set with -ldflags, or
// read from the module build info).
package version

import "runtime/debug"

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
