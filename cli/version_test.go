package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deployd/deployd/internal/version"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(append([]string{"deployd"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersionFlag(t *testing.T) {
	for _, flag := range []string{"--version", "-v"} {
		code, out, errOut := run(t, flag)
		if code != ExitOK || errOut != "" {
			t.Fatalf("deployd %s: exit %d, stderr %q", flag, code, errOut)
		}
		if want := "deployd version " + version.Long() + "\n"; out != want {
			t.Fatalf("deployd %s printed %q, want %q", flag, out, want)
		}
	}
}

func TestBadFlagHintNamesRealCommand(t *testing.T) {
	code, _, errOut := run(t, "--bogus")
	if code != ExitUsage {
		t.Fatalf("exit %d, want %d", code, ExitUsage)
	}
	if strings.Contains(errOut, "deployd deployd") || !strings.Contains(errOut, "see `deployd --help`") {
		t.Fatalf("top-level bad flag: %q", errOut)
	}
	_, _, errOut = run(t, "status", "--bogus")
	if !strings.Contains(errOut, "see `deployd status --help`") {
		t.Fatalf("command bad flag: %q", errOut)
	}
}

func TestDemoCLIWhenNotOnPath(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "deployd")
	if err := os.WriteFile(self, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	if cmd, note := demoCLI(self); cmd != self || !strings.Contains(note, "not on your PATH") {
		t.Fatalf("not on PATH: demoCLI = %q, %q; want the full path and a note", cmd, note)
	}
	goRun := filepath.Join(dir, "go-build123", "b001", "exe", "deployd")
	if cmd, _ := demoCLI(goRun); cmd != "go run ./cmd/deployd" {
		t.Fatalf("under go run: demoCLI = %q", cmd)
	}
	t.Setenv("PATH", dir)
	if cmd, note := demoCLI(self); cmd != "deployd" || note != "" {
		t.Fatalf("on PATH: demoCLI = %q, %q; want deployd and no note", cmd, note)
	}
}
