package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deployd start FILE and deployd delete edit the config file; with no agent
// on the socket the edit stays in the file (exit 0), for the agent to apply
// when it starts.
func TestStartFileWritesTheAppTable(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("PORT", "")
	for name, mode := range map[string]os.FileMode{"app.js": 0o644, "job.py": 0o644, "server": 0o755} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "deployd.toml")
	const head = "# hand-written\n[agent]\nstate_dir = \"state\"  # here\n"
	if err := os.WriteFile(cfg, []byte(head), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		full := append([]string{"deployd", args[0], "-c", cfg, "--socket", filepath.Join(dir, "none.sock")}, args[1:]...)
		code := Main(full, &out, &errb)
		return code, out.String() + errb.String()
	}
	read := func() string {
		b, err := os.ReadFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	code, msg := run("start", "app.js", "-i", "max", "--port", "3000")
	if code != 0 || !strings.Contains(msg, "added [apps.app]") || !strings.Contains(msg, "the agent does not answer") {
		t.Fatalf("start app.js: exit %d\n%s", code, msg)
	}
	body := read()
	for _, want := range []string{head + "\n# added by `deployd start -c ", " app.js -i max --port 3000`\n[apps.app]\n",
		`command   = ["node", "app.js"]`, `instances = "max"`, `listen    = ["tcp://0.0.0.0:3000"]`, `env       = { PORT = "3000" }`} {
		if !strings.Contains(body, want) {
			t.Errorf("config lacks %q:\n%s", want, body)
		}
	}
	if code, msg := run("start", "app.js", "--port", "3001"); code != 2 || !strings.Contains(msg, `app "app" is already in`) {
		t.Errorf("start of a name in the file: exit %d\n%s", code, msg)
	}

	for _, tc := range []struct {
		args []string
		want string // in the file
	}{
		{[]string{"start", "app.js", "--name", "zero", "-i", "0", "--port", "3002"}, "[apps.zero]\ncommand   = [\"node\", \"app.js\"]\ncwd       = " + tomlString(dir) + "\ninstances = \"max\""},
		{[]string{"start", "app.js", "--name", "most", "-i", "-1", "--port", "3003"}, "[apps.most]\ncommand   = [\"node\", \"app.js\"]\ncwd       = " + tomlString(dir) + "\ninstances = \"-1\""},
		{[]string{"start", "server", "--port", "3004", "--", "-v", "--x"}, `command   = ["./server", "-v", "--x"]`},
		{[]string{"start", "job.py", "--interpreter", "sh", "--port", "3005"}, `command   = ["sh", "job.py"]`},
		{[]string{"start", "job.py", "--name", "iargs", "--interpreter", "sh", "--interpreter-args", "-e -u", "--port", "3020", "--", "x"},
			`command   = ["sh", "-e", "-u", "job.py", "x"]`},
		{[]string{"start", "app.js", "--name", "nargs", "--node-args", "--max-old-space-size=512", "--port", "3021"},
			`command   = ["node", "--max-old-space-size=512", "app.js"]`},
		{[]string{"start", "app.js", "--name", "prod", "--port", "3006", "--env", "production"}, "environment = \"production\"\n\n[apps.prod.env_production]\nNODE_ENV = \"production\"\n"},
		// A node app without a port: the agent learns it from the app's listen.
		{[]string{"start", "app.js", "--name", "found"}, "[apps.found]\ncommand   = [\"node\", \"app.js\"]\ncwd       = " + tomlString(dir) + "\ninstances = 1\n# no listen: deployd binds"},
	} {
		if code, msg := run(tc.args...); code != 0 || !strings.Contains(read(), tc.want) {
			t.Errorf("%v: exit %d, config lacks %q\n%s\n%s", tc.args, code, tc.want, msg, read())
		}
	}
	before := read()
	for _, tc := range []struct {
		args []string
		want string // in the message
	}{
		{[]string{"start", "server", "--name", "noport"}, "which port does server listen on? add --port N"},
		{[]string{"start", "job.py", "--port", "3007"}, "job.py is not executable and not a .js, .cjs or .mjs file"},
		{[]string{"start", "app.js", "--name", "x", "-i", "many", "--port", "3008"}, `-i "many"`},
		{[]string{"start", "app.js", "--name", "x", "--port", "3009", "--env", "pro duction"}, `--env "pro duction"`},
		{[]string{"start", "app.js", "--name", "bad name", "--port", "3010"}, "bad app name"},
		{[]string{"start", "server", "--name", "x", "--interpreter-args", "-v", "--port", "3012"}, "--interpreter-args: server runs as a program of its own"},
	} {
		if code, msg := run(tc.args...); code != 2 || !strings.Contains(msg, tc.want) {
			t.Errorf("%v: exit %d, want 2 and %q\n%s", tc.args, code, tc.want, msg)
		}
	}
	if read() != before {
		t.Errorf("a refused start changed the file:\n%s", read())
	}
	t.Setenv("PORT", "3011")
	if code, msg := run("start", "app.js", "--name", "envport"); code != 0 || !strings.Contains(read(), `listen    = ["tcp://0.0.0.0:3011"]`) {
		t.Errorf("start with PORT set: exit %d\n%s\n%s", code, msg, read())
	}
	// The name of an app in the file is the other form: start what stop stopped.
	if code, msg := run("start", "app"); code != ExitUnreachable || strings.Contains(msg, "added") {
		t.Errorf("start app (an app of the config): exit %d, want the agent asked (3)\n%s", code, msg)
	}

	for _, name := range []string{"app", "zero", "most", "server", "job", "iargs", "nargs", "prod", "found", "envport"} {
		if code, msg := run("delete", name); code != 0 || !strings.Contains(msg, "removed [apps."+name+"]") {
			t.Errorf("delete %s: exit %d\n%s", name, code, msg)
		}
	}
	if got := read(); got != head {
		t.Errorf("after deleting every app added the config is\n%q\nwant the original\n%q", got, head)
	}
}
