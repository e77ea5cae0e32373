package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/tableflip"
	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
)

// fakeUpgrader stands for tableflip: no fork, and a record of what the
// agent asked of it. Its Stop unlinks the unix sockets it created, as
// tableflip's does.
type fakeUpgrader struct {
	parent bool
	exit   chan struct{}

	mu      sync.Mutex
	ready   bool
	stopped bool
	files   map[string]*os.File
	sockets []string
}

func newFakeUpgrader(parent bool) *fakeUpgrader {
	return &fakeUpgrader{parent: parent, exit: make(chan struct{}), files: map[string]*os.File{}}
}

func (f *fakeUpgrader) Fds() fdStore                                  { return f }
func (f *fakeUpgrader) Upgrade() error                                { return errors.New("fake: no upgrades") }
func (f *fakeUpgrader) Exit() <-chan struct{}                         { return f.exit }
func (f *fakeUpgrader) HasParent() bool                               { return f.parent }
func (f *fakeUpgrader) WaitForParent(context.Context) error           { return nil }
func (f *fakeUpgrader) File(name string) (*os.File, error)            { return nil, nil }
func (f *fakeUpgrader) Listener(string, string) (net.Listener, error) { return nil, nil }

func (f *fakeUpgrader) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready = true
	return nil
}

func (f *fakeUpgrader) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	for _, p := range f.sockets {
		_ = os.Remove(p)
	}
}

func (f *fakeUpgrader) AddFile(name string, file *os.File) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[name] = file
	return nil
}

func (f *fakeUpgrader) Listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
		f.mu.Lock()
		f.sockets = append(f.sockets, addr)
		f.mu.Unlock()
	}
	return ln, nil
}

func (f *fakeUpgrader) AddListener(string, string, tableflip.Listener) error { return nil }

func (f *fakeUpgrader) state() (ready, stopped bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, f.stopped
}

// appTOML is an [apps.NAME] table; command is a TOML array.
func appTOML(name, command, listen, extra string) string {
	return fmt.Sprintf("[apps.%s]\ncommand = %s\ninstances = 1\nlisten = [%q]\nready_timeout = \"5s\"\nstop_timeout = \"2s\"\n%s\n",
		name, command, listen, extra)
}

// writeConfig writes the agent's config in dir and returns its path.
func writeConfig(t *testing.T, dir, apps string) string {
	t.Helper()
	path := filepath.Join(dir, "deployd.toml")
	body := fmt.Sprintf("[agent]\nsocket = %q\nstate_dir = %q\nlog_dir = %q\n\n%s", filepath.Join(dir, "ctl.sock"),
		filepath.Join(dir, "state"), filepath.Join(dir, "logs"), apps)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// freeTCP is a loopback address that was free a moment ago.
func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runAgent runs the agent on path with upg; ready runs once it serves.
// It returns Run's error.
func runAgent(t *testing.T, path string, upg *fakeUpgrader, ready func(a *Agent)) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- Run(Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Ready: ready,
			upgrader: func(config.Agent) (upgrader, error) { return upg, nil }})
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s")
		return nil
	}
}

// A new agent (started by a handoff) whose workers never get ready gives up
// without Stopping the upgrader: that would unlink the control socket the
// previous agent still serves.
func TestNewAgentGivingUpLeavesSocketsAlone(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, appTOML("web", `["/bin/false"]`, "tcp://"+freeTCP(t), ""))
	upg := newFakeUpgrader(true)
	err := runAgent(t, path, upg, func(*Agent) { t.Error("a new agent whose workers failed must not get ready") })
	if err == nil || !strings.Contains(err.Error(), "upgrade abandoned") {
		t.Fatalf("Run = %v, want upgrade abandoned", err)
	}
	if ready, stopped := upg.state(); ready || stopped {
		t.Errorf("upgrader: ready=%v stopped=%v, want neither", ready, stopped)
	}
	if _, err := os.Lstat(filepath.Join(dir, "ctl.sock")); err != nil {
		t.Errorf("the control socket was removed: %v", err)
	}
}

// A shutdown after the agent got ready tells the upgrader, stops it and
// removes the control socket: the one teardown path.
func TestShutdownStopsUpgraderAndRemovesSocket(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, appTOML("web", `["/bin/sleep", "60"]`, "tcp://"+freeTCP(t), `ready = "delay:50ms"`))
	upg := newFakeUpgrader(false)
	if err := runAgent(t, path, upg, func(a *Agent) { a.Shutdown() }); err != nil {
		t.Fatalf("Run = %v, want nil after a shutdown", err)
	}
	if ready, stopped := upg.state(); !ready || !stopped {
		t.Errorf("upgrader: ready=%v stopped=%v, want both", ready, stopped)
	}
	if _, err := os.Lstat(filepath.Join(dir, "ctl.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the control socket is still there after a shutdown: %v", err)
	}
}

// reload runs a reload of apps and returns what the control API would
// answer: its events and result as JSON lines, or its refusal.
func reload(a *Agent, apps ...string) string {
	var mu sync.Mutex
	var b strings.Builder
	enc := json.NewEncoder(&b)
	res, err := a.Reload(context.Background(), api.ReloadRequest{Apps: apps}, Caller{}, func(e workers.Event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(api.Event{Time: e.Time, App: e.App, Type: api.EventType(e.Type), Message: e.Message})
	})
	if err != nil {
		return err.Error()
	}
	_ = enc.Encode(api.StreamLine{Result: res})
	return b.String()
}

// Each app's running config belongs to that app: a failed reload of A
// leaves A's, and a reload of B at the same time changes only B's.
func TestReloadsOwnTheirAppsConfig(t *testing.T) {
	dir := t.TempDir()
	aAddr, bAddr := freeTCP(t), freeTCP(t)
	sleep, ready := `["/bin/sleep", "60"]`, `ready = "delay:50ms"`
	path := writeConfig(t, dir, appTOML("a", sleep, "tcp://"+aAddr, ready)+appTOML("b", sleep, "tcp://"+bAddr, ready))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	upg := newFakeUpgrader(false)
	err = runAgent(t, path, upg, func(a *Agent) {
		defer a.Shutdown()
		// A moves to a busy address (its reload fails, nothing changes);
		// B gets a new env.
		writeConfig(t, dir, appTOML("a", sleep, "tcp://"+busy.Addr().String(), ready)+
			appTOML("b", sleep, "tcp://"+bAddr, ready+"\nenv = { B = \"2\" }"))
		var wg sync.WaitGroup
		var resA, resB string
		wg.Go(func() { resA = reload(a, "a") })
		wg.Go(func() { resB = reload(a, "b") })
		wg.Wait()
		if !strings.Contains(resA, `"outcome":"failed"`) || !strings.Contains(resB, `"outcome":"done"`) {
			t.Errorf("reload a: %s\nreload b: %s\nwant a failed and b done", resA, resB)
		}
		if got := a.AppConfig("a").Listen[0].Address; got != aAddr {
			t.Errorf("a's running config listens on %s after its failed reload, want %s", got, aAddr)
		}
		if got := a.AppConfig("b").Env; !slices.Contains(got, "B=2") {
			t.Errorf("b's running config env = %q after its reload, want B=2", got)
		}
		if c, err := net.DialTimeout("tcp", aAddr, time.Second); err != nil {
			t.Errorf("a's listener closed after its failed reload: %v", err)
		} else {
			c.Close()
		}
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
}
