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
