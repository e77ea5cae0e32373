package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
)

// The agent says which folders it created (as root: /run/deployd,
// /var/lib/deployd, /var/log/deployd), and removes the control socket's
// folder at shutdown when it created it and it is empty.
func TestAgentLogsCreatedFoldersAndRemovesEmptyRunDir(t *testing.T) {
	dir := t.TempDir()
	run, state, logs := filepath.Join(dir, "run", "deployd"), filepath.Join(dir, "lib", "deployd"), filepath.Join(dir, "log", "deployd")
	body := fmt.Sprintf("[agent]\nsocket = %q\nstate_dir = %q\nlog_dir = %q\n\n%s", filepath.Join(run, "deployd.sock"), state, logs,
		appTOML("web", `["/bin/sleep", "60"]`, "tcp://"+freeTCP(t), `ready = "delay:50ms"`))
	path := filepath.Join(dir, "deployd.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	upg := newFakeUpgrader(false)
	done := make(chan error, 1)
	go func() {
		done <- Run(Options{ConfigPath: path, Logger: log, Ready: func(a *Agent) { a.Shutdown() },
			upgrader: func(config.Agent) (upgrader, error) { return upg, nil }})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s")
	}
	for _, want := range []string{
		"created folder: path=" + filepath.Join(dir, "run") + ` for="control socket"`,
		"created folder: path=" + filepath.Join(dir, "lib") + ` for="state (state_dir)"`,
		"created folder: path=" + filepath.Join(dir, "log") + ` for="app logs (log_dir)"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("agent log lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the control socket's folder, created by the agent, is still there after shutdown: %v", err)
	}
	if _, err := os.Stat(state); err != nil {
		t.Errorf("state_dir removed: %v", err)
	}
}
