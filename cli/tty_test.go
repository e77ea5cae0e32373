package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func TestWatchHeaderNoControlCodesIntoPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	watchHeader(w, time.Second, true)
	watchHeader(w, time.Second, false)
	w.Close()
	out, _ := io.ReadAll(r)
	if bytes.ContainsRune(out, '\033') || !strings.HasPrefix(string(out), "\n--- ") {
		t.Errorf("into a pipe, status --watch wrote %q: want no control codes, a separator between refreshes", out)
	}

	tty, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer tty.Close()
	if !isTerminal(tty) {
		t.Fatal("a pseudo-terminal is not a terminal")
	}
	if isTerminal(w) || isTerminal(&bytes.Buffer{}) {
		t.Error("a pipe or a buffer is a terminal")
	}
}

func TestScaleNegativeNeedsNoDoubleDash(t *testing.T) {
	app := &cli.App{Commands: []*cli.Command{scaleCommand()}}
	got := interspersed(app, []string{"deployd", "scale", "web", "-1", "--json"})
	want := []string{"deployd", "scale", "--json", "web", "-1"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("interspersed = %q, want %q", got, want)
	}
	// The whole CLI parses it: the only failure is the agent that is not there.
	code, _, errOut := run(t, "scale", "web", "-1", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if code != ExitUnreachable {
		t.Errorf("deployd scale web -1: exit %d, want %d (unreachable):\n%s", code, ExitUnreachable, errOut)
	}
}
