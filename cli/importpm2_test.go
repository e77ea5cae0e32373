package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

func TestImportPM2WritesALoadableConfig(t *testing.T) {
	needNode(t)
	dir := t.TempDir()
	for _, f := range []string{"app.js", "worker.js"} {
		os.WriteFile(filepath.Join(dir, f), nil, 0o644)
	}
	eco := filepath.Join(dir, "ecosystem.config.js")
	os.WriteFile(eco, []byte(`module.exports = { apps: [{
  name: 'web', script: 'app.js', instances: 'max', exec_mode: 'cluster',
  env: { PORT: 3000 }, env_production: { NODE_ENV: 'production' },
  wait_ready: true, listen_timeout: 10000, kill_timeout: 5000, max_memory_restart: '300M',
  cron_restart: '0 3 * * *', max_restarts: 16,
}, { name: 'worker', script: 'worker.js', exec_mode: 'fork' }] }
`), 0o644)
	out := filepath.Join(dir, "apps.toml")
	var stdout, stderr bytes.Buffer
	if err := newApp(&stdout, &stderr).Run([]string{"deployd", "import", "pm2", "--env", "production", "-o", out, eco}); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	body, _ := os.ReadFile(out)
	for _, want := range []string{`command       = ["node", "app.js"]`, `listen        = ["tcp://0.0.0.0:3000"]`,
		`ready         = "node-ipc"`, `ready_timeout = "10000ms"`, `stop_timeout  = "5000ms"`, `max_memory    = "300MiB"`,
		"[apps.web.env_production]\n\"NODE_ENV\" = \"production\"", `environment   = "production"`, "max_restarts = 16", `stop_signal   = "SIGINT"`, "[apps.worker]", "instances     = 1",
		`recycle_at    = "0 3 * * *"`, "# listen: none needed: deployd binds the port the app's own listen(port) asks for"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("output lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(stderr.String(), "worker: listen:") {
		t.Errorf("a node app without PORT is noted as unmapped; its listen is discovered:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "cron_restart") {
		t.Errorf("cron_restart is mapped to recycle_at, yet noted:\n%s", stderr.String())
	}
	full := filepath.Join(dir, "deployd.toml")
	os.WriteFile(full, append([]byte("[agent]\nsocket = \"s.sock\"\nstate_dir = \"state\"\nlog_dir = \"logs\"\n\n"), body...), 0o644)
	if _, err := config.Load(full); err != nil {
		t.Errorf("the imported config does not load: %v\n%s", err, body)
	}
}

// import -o next to an agent that runs another file says that agent will
// not start the apps, and how to: an import then a reload started nothing.
func TestImportPM2OutputNotesTheAgentsOtherFile(t *testing.T) {
	needNode(t)
	dir := t.TempDir()
	eco := filepath.Join(dir, "ecosystem.config.js")
	if err := os.WriteFile(eco, []byte(`module.exports = { apps: [{ name: 'web', script: 'app.js' }] }`), 0o644); err != nil {
		t.Fatal(err)
	}
	agentFile := filepath.Join(dir, "agent.toml")
	sock := filepath.Join(dir, "agent.sock")
	fakeAgent(t, dir, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.Status{Agent: api.Agent{Config: agentFile, Socket: sock}})
	})

	for out, want := range map[string]string{
		filepath.Join(dir, "deployd.toml"): "note: the agent on " + sock + " runs " + agentFile + ", not " + filepath.Join(dir, "deployd.toml") +
			", and does not start these apps: add them to its file and start them with `deployd import pm2 " + eco + " --apply`",
		agentFile: "", // the agent's own file: no note
	} {
		var stdout, stderr bytes.Buffer
		if err := newApp(&stdout, &stderr).Run([]string{"deployd", "import", "pm2", "--socket", sock, "-o", out, eco}); err != nil {
			t.Fatalf("%v\n%s", err, stderr.String())
		}
		if got := stderr.String(); want == "" && strings.Contains(got, "note:") || !strings.Contains(got, want) {
			t.Errorf("import -o %s: stderr %q, want %q", out, got, want)
		}
	}
}
