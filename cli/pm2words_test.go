package cli

import (
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
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
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			calls.Add(1)
		}
		_ = json.NewEncoder(w).Encode(api.Status{Agent: api.Agent{Config: cfgPath}})
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

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
