package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Each kind of TOML syntax error is reported at the real mistake, with the
// line itself, a caret under the column and what was expected.
func TestSyntaxErrorPositions(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		line, col int
		text      string // the line shown
		want      string // what the message says
	}{
		{"array missing ] before the next key",
			web + "listen = [\n  \"tcp://127.0.0.1:3000\",\n  \"tcp://127.0.0.1:3001\"\nready = \"notify\"\n",
			5, 25, `  "tcp://127.0.0.1:3001"`, "the array is missing its closing ]"},
		{"array missing ] before a table, after a comment",
			web + "listen = [\"tcp://127.0.0.1:3000\" # the port\n\n[apps.api]\ncommand = [\"./server\"]\n",
			3, 33, `listen = ["tcp://127.0.0.1:3000" # the port`, "the array is missing its closing ]"},
		{"array missing comma",
			web + "listen = [\"tcp://:1\" \"tcp://:2\"]\n",
			3, 22, `listen = ["tcp://:1" "tcp://:2"]`, "expected a comma or ] between array items, found `\"`"},
		{"table header missing ]",
			"[apps.web\ncommand = [\"./server\"]\n",
			1, 10, "[apps.web", "the table header is missing its closing ]"},
		{"unterminated string",
			web + "cwd = \"srv\nready = \"notify\"\n",
			3, 7, `cwd = "srv`, "the string that starts here is not closed"},
		{"unterminated multi-line string",
			web + "cwd = \"\"\"srv\nready = \"notify\"\n",
			3, 7, `cwd = """srv`, `add """ where it ends`},
		{"missing =",
			web + "ready \"notify\"\n",
			3, 7, `ready "notify"`, "expected = between the key and its value, found `\"`"},
		{"bad value",
			web + "cwd = srv\n",
			3, 7, "cwd = srv", `strings need quotes ("srv")`},
		{"duplicate key",
			web + "instances = 2\ninstances = 3\n",
			4, 1, "instances = 3", "apps.web.instances is already defined above: remove one of the two"},
		{"inline table missing }",
			web + "env = { A = \"x\", B = \"y\"\nready = \"notify\"\n",
			3, 25, `env = { A = "x", B = "y"`, "the inline table is missing its closing }"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body)
			_, err := Load(path)
			var cerr *Error
			if !errors.As(err, &cerr) || len(cerr.Problems) != 1 {
				t.Fatalf("want one problem, got %v", err)
			}
			p := cerr.Problems[0]
			if p.Line != tt.line || p.Col != tt.col {
				t.Errorf("at %d:%d, want %d:%d:\n%s", p.Line, p.Col, tt.line, tt.col, err)
			}
			msg := err.Error()
			prefix := fmt.Sprintf("%s:%d:%d: syntax error: ", path, tt.line, tt.col)
			gutter := fmt.Sprintf("%5d | ", tt.line)
			shown := "\n" + gutter + tt.text + "\n" + strings.Repeat(" ", len(gutter)+tt.col-1) + "^"
			if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, tt.want) || !strings.Contains(msg, shown) {
				t.Errorf("message:\n%s\nwant prefix %q, %q and the line with a caret:%s", msg, prefix, tt.want, shown)
			}
		})
	}
}
