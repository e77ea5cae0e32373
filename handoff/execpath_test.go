package handoff

import (
	"os"
	"path/filepath"
	"testing"
)

// ExecPath finds what the shim's exec.LookPath would, and says when it
// cannot tell (the shim then starts the app and reports the problem).
func TestExecPathResolvesAsTheShimWould(t *testing.T) {
	bin, other, dir := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bin, "app"), 0o755)
	write(filepath.Join(other, "app"), 0o755)
	write(filepath.Join(bin, "plain"), 0o644)
	write(filepath.Join(dir, "local"), 0o755)
	path := "PATH=" + bin + ":" + other
	for _, c := range []struct {
		name, argv0 string
		env         []string
		want        string
		ok          bool
	}{
		{"first PATH entry wins", "app", []string{path}, filepath.Join(bin, "app"), true},
		{"first PATH variable wins", "app", []string{"PATH=" + other, path}, filepath.Join(other, "app"), true},
		{"not executable", "plain", []string{path}, "", false},
		{"not found", "nope", []string{path}, "", false},
		{"no PATH", "app", nil, "", false},
		{"relative PATH entry first", "app", []string{"PATH=.:" + bin}, "", false},
		{"empty PATH entry first", "app", []string{"PATH=:" + bin}, "", false},
		{"absolute", filepath.Join(bin, "app"), []string{path}, filepath.Join(bin, "app"), true},
		{"relative to the folder", "./local", nil, "./local", true},
		{"relative, missing", "./app", nil, "./app", false},
	} {
		got, ok := ExecPath(c.argv0, c.env, dir)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("%s: ExecPath(%q) = %q, %v; want %q, %v", c.name, c.argv0, got, ok, c.want, c.ok)
		}
	}
}
