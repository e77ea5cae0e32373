package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// editBase is a config as people write them: comments above and beside
// keys, a multi-line array, a string holding a table header, blank lines.
const editBase = `# deployd for example.com
[agent]
socket = "deployd.sock"   # next to this file
state_dir = "state"

# the site
[apps.web]
command = [
  "./server",
  "-v",
]
banner = """
[apps.fake]
"""
instances = 2

# its variables
[apps.web.env]
MODE = "prod"

[apps.api]
command = ["./server"]  # same binary
`

func TestAppendAppKeepsTheRest(t *testing.T) {
	base := strings.Replace(editBase, "banner = \"\"\"\n[apps.fake]\n\"\"\"\n", "", 1)
	block := "[apps.jobs]\ncommand = [\"./server\", \"jobs\"]\ninstances = 1\n"
	out, err := AppendApp([]byte(base), "jobs", block)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), base) || !strings.HasSuffix(string(out), "\n\n"+block) {
		t.Fatalf("the rest of the file changed or the block is not at the end:\n%s", out)
	}
	c := loadOK(t, string(out))
	if !slices.Equal(c.AppNames, []string{"api", "jobs", "web"}) || c.Apps["jobs"].Instances != 1 {
		t.Fatalf("apps %v after the append", c.AppNames)
	}
	if _, err := AppendApp(out, "web", "[apps.web]\ncommand = [\"./server\"]\n"); !errors.Is(err, ErrAppExists) {
		t.Fatalf("append of an existing app: %v, want ErrAppExists", err)
	}
	// The block must define only the app it names.
	if _, err := AppendApp([]byte(base), "x", "[apps.x]\ncommand = [\"./server\"]\n[agent]\nlog_dir = \"l\"\n"); err == nil {
		t.Fatal("a block that changes [agent] was appended")
	}
	// An empty file (an [agent]-less start) gets the block alone.
	out, err = AppendApp(nil, "jobs", block)
	if err != nil || string(out) != block {
		t.Fatalf("append to an empty file: %q, %v", out, err)
	}
}

func TestRemoveApp(t *testing.T) {
	out, err := RemoveApp([]byte(editBase), "web")
	if err != nil {
		t.Fatal(err)
	}
	want := `# deployd for example.com
[agent]
socket = "deployd.sock"   # next to this file
state_dir = "state"

[apps.api]
command = ["./server"]  # same binary
`
	if string(out) != want {
		t.Fatalf("after removing web:\n%s\nwant:\n%s", out, want)
	}
	// The last app: what came before it stays, blank lines at the end go.
	out, err = RemoveApp(out, "api")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# deployd for example.com\n[agent]\nsocket = \"deployd.sock\"   # next to this file\nstate_dir = \"state\"\n"; string(out) != want {
		t.Fatalf("after removing api:\n%q\nwant:\n%q", out, want)
	}
	loadOK(t, string(out))
	if _, err := RemoveApp(out, "api"); !errors.Is(err, ErrNoApp) {
		t.Fatalf("remove of a missing app: %v, want ErrNoApp", err)
	}
}

func TestRemoveAppRefusesOtherForms(t *testing.T) {
	for _, body := range []string{
		"[apps]\nweb = { command = [\"./server\"] }\n",
		"[apps.web]\ncommand = [\"./server\"]\n[apps.api]\ncommand = [\"./server\"]\n[apps]\nweb.instances = 2\n",
	} {
		if out, err := RemoveApp([]byte(body), "web"); err == nil {
			t.Errorf("removed web from\n%s\nas\n%s", body, out)
		}
	}
}

func TestSetAppKey(t *testing.T) {
	out, err := SetAppKey([]byte(editBase), "web", "environment", `"production"`)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(editBase, "instances = 2\n", "instances = 2\nenvironment = \"production\"\n", 1)
	if string(out) != want {
		t.Fatalf("added:\n%s\nwant:\n%s", out, want)
	}
	// After a table whose last key spans lines.
	out, err = SetAppKey([]byte(editBase), "api", "environment", `"production"`)
	if err != nil {
		t.Fatal(err)
	}
	if want := editBase + "environment = \"production\"\n"; string(out) != want {
		t.Fatalf("added to api:\n%s\nwant:\n%s", out, want)
	}
	multi := "[apps.web]\ncommand = [\n  \"./server\",\n]\n\n# next\n[apps.api]\ncommand = [\"./server\"]\n"
	out, err = SetAppKey([]byte(multi), "web", "environment", `"production"`)
	if want := strings.Replace(multi, "]\n\n", "]\nenvironment = \"production\"\n\n", 1); err != nil || string(out) != want {
		t.Fatalf("added after a multi-line array: %v\n%s\nwant:\n%s", err, out, want)
	}
	base := strings.Replace(editBase, "instances = 2\n", "  environment = \"dev\" # was staging\ninstances = 2\n", 1)
	out, err = SetAppKey([]byte(base), "web", "environment", `"production"`)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(base, `"dev"`, `"production"`, 1); string(out) != want {
		t.Fatalf("replaced:\n%s\nwant:\n%s", out, want)
	}
}

func TestWriteEdited(t *testing.T) {
	path := writeConfig(t, "[agent]\nsocket = \"s\"\n")
	must(t, os.Chmod(path, 0o600))
	if _, err := WriteEdited(path, []byte("[apps.web]\ncommand = [\"./nope\"]\n")); err == nil {
		t.Fatal("an invalid config was written")
	}
	if b, _ := os.ReadFile(path); string(b) != "[agent]\nsocket = \"s\"\n" {
		t.Fatalf("the file changed after a refused edit: %q", b)
	}
	data := "[agent]\nsocket = \"s\"\n\n[apps.web]\ncommand = [\"./server\"]\n"
	c, err := WriteEdited(path, []byte(data))
	if err != nil || c.Apps["web"] == nil {
		t.Fatalf("write: %v", err)
	}
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after the write, want 0600 kept", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".deployd.toml.tmp-*")); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}

func TestEnvironments(t *testing.T) {
	body := web + `env = { A = "1", B = "2" }
environment = "production"
[apps.web.env_production]
B = "prod"
C = "3"
[apps.web.env_dev]
B = "dev"
`
	a := loadOK(t, body).Apps["web"]
	if want := []string{"A=1", "B=prod", "C=3"}; !slices.Equal(a.Env, want) {
		t.Errorf("env %v, want %v", a.Env, want)
	}
	if a.Environment != "production" || !slices.Equal(a.Environments, []string{"dev", "production"}) {
		t.Errorf("environment %q of %v", a.Environment, a.Environments)
	}
	// Without a selection the env_ tables are not used.
	a = loadOK(t, strings.Replace(body, "environment = \"production\"\n", "", 1)).Apps["web"]
	if want := []string{"A=1", "B=2"}; !slices.Equal(a.Env, want) {
		t.Errorf("env without environment %v, want %v", a.Env, want)
	}
	for _, tc := range []struct{ body, key, msg string }{
		{web + "environment = \"prod\"\n[apps.web.env_production]\nB = \"x\"\n", "apps.web.environment", "no [apps.web.env_prod] table (this app has env_production)"},
		{web + "environment = \"production\"\n", "apps.web.environment", "this app has none"},
		{web + "[apps.web.env_production]\nB = 1\n", "apps.web.env_production.B", "want a string"},
		{web + "[apps.web.env_production]\nLISTEN_FDS = \"1\"\n", "apps.web.env_production.LISTEN_FDS", "set by the agent"},
		{web + "env_ = { A = \"1\" }\n", "apps.web.env_", "unknown key"},
	} {
		path := writeConfig(t, tc.body)
		data, _ := os.ReadFile(path)
		_, err := parse(path, data, fakeEnv(1000))
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("config\n%s\ngave %v; want %s: ...%s", tc.body, err, tc.key, tc.msg)
		}
	}
}
