package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestHelpCommandMatchesHelpFlag: `deployd help CMD [SUB]` prints what
// `deployd CMD [SUB] --help` prints, for every command and subcommand.
// Upstream urfave/cli v2.27.7 stops after USAGE for `help CMD` when CMD has
// subcommands, and shows CMD's help for `help CMD SUB`.
func TestHelpCommandMatchesHelpFlag(t *testing.T) {
	var paths [][]string
	var walk func(prefix []string, cmds []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden || c.Name == "help" {
				continue
			}
			p := append(append([]string{}, prefix...), c.Name)
			paths = append(paths, p)
			walk(p, c.Subcommands)
		}
	}
	walk(nil, newApp(&bytes.Buffer{}, &bytes.Buffer{}).Commands)
	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		if code := Main(append([]string{"deployd"}, args...), &out, &errOut); code != ExitOK {
			t.Fatalf("deployd %s: exit %d\n%s", strings.Join(args, " "), code, errOut.String())
		}
		return out.String()
	}
	for _, p := range paths {
		flag := run(append(append([]string{}, p...), "--help")...)
		if !strings.Contains(flag, "USAGE:") || !strings.Contains(flag, "--help") {
			t.Errorf("deployd %s --help has no USAGE or options:\n%s", strings.Join(p, " "), flag)
		}
		if cmd := run(append([]string{"help"}, p...)...); cmd != flag {
			t.Errorf("deployd help %s differs from --help:\n%s\n--- --help:\n%s", strings.Join(p, " "), cmd, flag)
		}
	}
	if len(paths) < 20 {
		t.Fatalf("only %d commands found", len(paths))
	}
}
