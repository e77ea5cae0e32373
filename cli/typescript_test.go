package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestStripsTypes(t *testing.T) {
	for v, want := range map[string]bool{
		"v20.20.2\n": false, "v22.17.1": false, "v22.18.0": true, "v23.5.0": false, "v23.6.0": true,
		"v24.1.0": true, "v25.0.0-nightly": true, "garbage": false, "": false,
	} {
		if got := stripsTypes(v); got != want {
			t.Errorf("stripsTypes(%q) = %v, want %v", v, got, want)
		}
	}
}

// The project's tsx package is used as node's loader; a .bin runner above
// the script's folder is found when there is no package; nothing gives the
// way to install one.
func TestTypeScriptRunner(t *testing.T) {
	t.Setenv("PATH", "/nonexistent") // no node: no type stripping
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	write := func(rel string, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{}"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("src/server.ts", 0o644)
	if _, err := typeScriptRunner(filepath.Join(src, "server.ts"), dir); err == nil || exitCodeOf(err) != ExitUsage {
		t.Errorf("no runner: err %v, want a usage error", err)
	}
	write("node_modules/.bin/ts-node", 0o755)
	if got, err := typeScriptRunner(filepath.Join(src, "server.ts"), src); err != nil || !slices.Equal(got, []string{filepath.Join(dir, "node_modules/.bin/ts-node")}) {
		t.Errorf("ts-node above: %v, %v", got, err)
	}
	write("node_modules/.bin/tsx", 0o755)
	if got, _ := typeScriptRunner(filepath.Join(src, "server.ts"), src); !slices.Equal(got, []string{filepath.Join(dir, "node_modules/.bin/tsx")}) {
		t.Errorf("tsx before ts-node: %v", got)
	}
	write("node_modules/tsx/package.json", 0o644)
	if got, _ := typeScriptRunner(filepath.Join(src, "server.ts"), src); !slices.Equal(got, []string{"node", "--import", "tsx"}) {
		t.Errorf("tsx installed: %v, want node --import tsx", got)
	}
}

// A node on the user's PATH that strips types is written by its path: the
// agent looks a bare "node" up in its own PATH, where an older node that
// cannot run .ts may come first.
func TestTypeScriptRunnerNamesTheNodeItChecked(t *testing.T) {
	bin := t.TempDir()
	node := filepath.Join(bin, "node")
	if err := os.WriteFile(node, []byte("#!/bin/sh\necho v22.18.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	dir := t.TempDir()
	file := filepath.Join(dir, "server.ts")
	if err := os.WriteFile(file, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := typeScriptRunner(file, dir); err != nil || !slices.Equal(got, []string{node}) {
		t.Errorf("node 22.18 on PATH: %v, %v; want [%s]", got, err, node)
	}
	if err := os.WriteFile(node, []byte("#!/bin/sh\necho v20.20.2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := typeScriptRunner(file, dir); err == nil || exitCodeOf(err) != ExitUsage {
		t.Errorf("node 20 on PATH: err %v, want a usage error", err)
	}
}

// A TypeScript runner that compiles at start gets a ready_timeout above the
// default, with its reason; plain node and bun keep the default.
func TestRunnerStartup(t *testing.T) {
	for _, c := range []struct {
		runner []string
		want   string
	}{
		{[]string{"/p/node_modules/.bin/ts-node"}, "2m"},
		{[]string{"node", "--import", "tsx"}, "1m"},
		{[]string{"/p/node_modules/.bin/tsx"}, "1m"},
		{[]string{"node"}, ""},
		{[]string{"/usr/local/bin/bun"}, ""},
	} {
		got, why := runnerStartup(c.runner)
		if got != c.want || (got != "") != (why != "") {
			t.Errorf("runnerStartup(%q) = %q, %q; want %q and a reason with it", c.runner, got, why, c.want)
		}
	}
}
