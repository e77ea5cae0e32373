package cli

import (
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

// The app arguments of one command are mapped against one reading of the
// agent's config: one status call and one load, however many there are.
func TestAppArgsReadTheAgentsConfigOnce(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "deployd.toml")
	cfgText := "[apps.api]\ncommand = [\"node\", \"api.js\"]\n\n[apps.worker]\ncommand = [\"node\", \"worker.js\"]\n"
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	sock := fakeAgent(t, dir, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			calls.Add(1)
		}
		_ = json.NewEncoder(w).Encode(api.Status{Agent: api.Agent{Config: cfgPath}})
	})

	app := newApp(io.Discard, io.Discard)
	app.Metadata = map[string]any{}
	set := flag.NewFlagSet("reload", flag.ContinueOnError)
	set.String("socket", sock, "")
	set.String("config", "", "")
	c := cli.NewContext(app, set, nil)
	got, err := appArgs(c, []string{"api.js", "./worker.js", "api"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"api", "worker", "api"}; !slices.Equal(got, want) {
		t.Errorf("apps %v, want %v", got, want)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d status calls to map 3 app arguments, want 1", n)
	}
}

// `deployd start web.js` after `deployd stop web.js` starts the stopped app
// again, as pm2 start does: the app start would add is in the agent's
// file, runs that same file, and is stopped. Anything else is the PM2
// form (which refuses a name the file has).
func TestStartScriptOfAStoppedApp(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	cfgPath := filepath.Join(dir, "deployd.toml")
	cfgText := "[apps.web]\ncommand = [\"node\", \"web.js\"]\n"
	for _, p := range []string{cfgPath, filepath.Join(dir, "web.js"), filepath.Join(other, "web.js")} {
		text := "\n"
		if p == cfgPath {
			text = cfgText
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var state atomic.Value
	sock := fakeAgent(t, dir, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.Status{Agent: api.Agent{Config: cfgPath},
			Apps: []api.App{{Name: "web", State: state.Load().(string)}}})
	})

	stopped := func(args ...string) string {
		app := newApp(io.Discard, io.Discard)
		app.Metadata = map[string]any{}
		set := flag.NewFlagSet("start", flag.ContinueOnError)
		set.String("socket", sock, "")
		set.String("config", "", "")
		for _, f := range []string{"name", "instances", "env", "interpreter", "env-file"} {
			set.String(f, "", "")
		}
		set.Int("port", 0, "")
		if err := set.Parse(args); err != nil {
			t.Fatal(err)
		}
		return stoppedAppOfScript(cli.NewContext(app, set, nil))
	}
	t.Chdir(dir)
	state.Store("stopped")
	if got := stopped("web.js"); got != "web" {
		t.Errorf("start web.js with web stopped: %q, want web", got)
	}
	if got := stopped("--name", "web", "./web.js"); got != "web" {
		t.Errorf("start ./web.js --name web with web stopped: %q, want web", got)
	}
	for _, args := range [][]string{
		{"--instances", "2", "web.js"},   // a flag that changes the app: the PM2 form
		{"--port", "3000", "web.js"},     // the same
		{"--name", "api", "web.js"},      // another app
		{filepath.Join(other, "web.js")}, // another file of that name
	} {
		if got := stopped(args...); got != "" {
			t.Errorf("start %v with web stopped: %q, want the PM2 form", args, got)
		}
	}
	state.Store("running")
	if got := stopped("web.js"); got != "" {
		t.Errorf("start web.js with web running: %q, want the PM2 form", got)
	}
}

// fakeAgent serves h as an agent's control socket, agent.sock in dir,
// until the test ends, and returns the socket's path.
func fakeAgent(t *testing.T, dir string, h http.HandlerFunc) string {
	t.Helper()
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

// needNode skips a test that evaluates JavaScript where node is missing,
// except in CI, which must run it.
func needNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not installed, and CI must run this test")
		}
		t.Skip("node not installed")
	}
}
