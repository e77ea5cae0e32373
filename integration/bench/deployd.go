package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// deploydSystem runs the app under a deployd agent of its own, one worker per core.
type deploydSystem struct {
	b     *bench
	label string
	app   appSpec

	p       int
	metrics int   // the [agent] metrics port; 0: metrics off (set before start to turn them on)
	extra   []int // ports of the app.extraApps apps
	dir     string
	config  string
	socket  string
	agent   *proc
	client  *api.Client
	// steps: run the agent at debug level with a JSON log and keep each
	// reload's steps (lastSteps) and the CLI's own duration (lastCLI).
	steps     bool
	logOff    int64
	lastSteps *reloadSteps
	lastCLI   time.Duration
}

func (s *deploydSystem) name() string    { return s.label }
func (s *deploydSystem) port() int       { return s.p }
func (s *deploydSystem) managerPID() int { return s.agent.pid() }

func (s *deploydSystem) workerPIDs() []int {
	st, err := s.client.Status(context.Background(), "web")
	if err != nil {
		return nil
	}
	var pids []int
	for _, a := range st.Apps {
		for _, w := range a.Workers {
			pids = append(pids, w.PID)
		}
	}
	return pids
}

func (s *deploydSystem) writeConfig(version string) error {
	var cmd, ready string
	if s.app.kind == "go" {
		cmd, ready = fmt.Sprintf("%q", s.b.testapp), "notify"
	} else {
		cmd, ready = fmt.Sprintf("%q, %q", s.b.node, s.b.appJS), "node-ipc"
	}
	var env []string
	for _, kv := range s.app.env(version) {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, fmt.Sprintf("%s = %q", k, v))
	}
	agent := ""
	if s.metrics != 0 {
		agent = fmt.Sprintf("metrics = \"127.0.0.1:%d\"\n", s.metrics)
	}
	body := fmt.Sprintf(`[agent]
socket = %q
state_dir = "state"
log_dir = "logs"
%s`, s.socket, agent)
	steer := ""
	if s.app.balance != "" {
		steer = fmt.Sprintf("balance = %q\nspares = %d\n", s.app.balance, s.app.spares)
	}
	for i, port := range append([]int{s.p}, s.extra...) {
		name := "web"
		if i > 0 {
			name = fmt.Sprintf("app%d", i)
		}
		body += fmt.Sprintf(`
[apps.%s]
command = [%s]
instances = %d
listen = ["tcp://127.0.0.1:%d"]
ready = %q
ready_timeout = "60s"
stop_timeout = "30s"
min_ready = "0s"
env = { %s }
%s`, name, cmd, s.app.instances, port, ready, strings.Join(env, ", "), steer)
	}
	return os.WriteFile(s.config, []byte(body), 0o644)
}

func (s *deploydSystem) start(ctx context.Context) error {
	var err error
	if s.p, err = freePort(); err != nil {
		return err
	}
	s.extra = nil
	for range s.app.extraApps {
		p, err := freePort()
		if err != nil {
			return err
		}
		s.extra = append(s.extra, p)
	}
	if s.dir, err = os.MkdirTemp(s.b.dir, s.label+"-"); err != nil {
		return err
	}
	s.config = filepath.Join(s.dir, "deployd.toml")
	s.socket = filepath.Join(s.dir, "deployd.sock")
	s.client = api.NewClient(s.socket)
	if err := s.writeConfig("v1"); err != nil {
		return err
	}
	return s.startAgent(ctx)
}

// waitReady polls the agent until every worker is ready.
func (s *deploydSystem) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := s.client.Status(ctx, "")
		if err == nil && allReady(st, 1+s.app.extraApps, s.app.instances+s.app.spares) {
			for _, a := range st.Apps {
				for _, w := range a.Workers {
					trackPID(w.PID, s.label+" worker")
				}
			}
			return nil
		}
		if s.agent.exited() {
			return fmt.Errorf("%s: agent exited: %v (see %s)", s.label, s.agent.err, filepath.Join(s.dir, "agent.log"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: workers not ready within %v (last: %v)", s.label, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// allReady reports whether st has apps apps of n ready workers each.
func allReady(st *api.Status, apps, n int) bool {
	if len(st.Apps) != apps {
		return false
	}
	for _, a := range st.Apps {
		if len(a.Workers) != n {
			return false
		}
		for _, w := range a.Workers {
			if w.State != "ready" {
				return false
			}
		}
	}
	return true
}

// cli runs the deployd CLI against this agent.
func (s *deploydSystem) cli(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return runCmd(ctx, timeout, []string{"DEPLOYD_SOCKET=" + s.socket, "DEPLOYD_CONFIG=" + s.config},
		s.b.deployd, args...)
}

// reload is `deployd reload web` after writing the config with the new
// version; the time of the command alone is lastCLI.
func (s *deploydSystem) reload(ctx context.Context, version string) error {
	if err := s.writeConfig(version); err != nil {
		return err
	}
	t0 := time.Now()
	out, err := s.cli(ctx, 5*time.Minute, "reload", "web")
	t1 := time.Now()
	if err != nil {
		return fmt.Errorf("deployd reload: %w\n%s", err, out)
	}
	s.lastCLI, s.lastSteps = t1.Sub(t0), nil
	if s.steps {
		if s.lastSteps, s.logOff, err = parseSteps(filepath.Join(s.dir, "agent.log"), s.logOff, t0, t1); err != nil {
			return err
		}
	}
	st, err := s.client.Status(ctx, "web")
	if err != nil {
		return err
	}
	for _, w := range st.Apps[0].Workers {
		trackPID(w.PID, s.label+" worker")
	}
	return nil
}

// status is `deployd status --json`.
func (s *deploydSystem) status(ctx context.Context) (*api.Status, error) {
	out, err := s.cli(ctx, 10*time.Second, "status", "--json", "web")
	if err != nil {
		return nil, fmt.Errorf("deployd status: %w\n%s", err, out)
	}
	var st api.Status
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("deployd status --json: %w", err)
	}
	return &st, nil
}

func (s *deploydSystem) slots(ctx context.Context) (map[int]int, error) {
	st, err := s.status(ctx)
	if err != nil {
		return nil, err
	}
	m := map[int]int{}
	for _, w := range st.Apps[0].Workers {
		m[w.Slot] = w.PID
	}
	return m, nil
}

// waitReplaced polls `deployd status --json` until slot has a new ready worker.
func (s *deploydSystem) waitReplaced(ctx context.Context, slot, old int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.status(ctx)
		if err != nil {
			return err
		}
		for _, w := range st.Apps[0].Workers {
			if w.Slot == slot && w.PID != old && w.PID != 0 && w.State == "ready" {
				trackPID(w.PID, s.label+" worker")
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("%s: slot %d not replaced within 60s", s.label, slot)
}

// stop is SIGTERM to the agent, which drains its workers; anything left is killed.
func (s *deploydSystem) stop() error {
	if s.agent == nil {
		return nil
	}
	pids := s.workerPIDs()
	err := s.agent.stop(syscall.SIGTERM, 60*time.Second)
	for _, pid := range pids {
		if alive(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			if err == nil {
				err = fmt.Errorf("%s: worker %d outlived the agent", s.label, pid)
			}
		}
	}
	return err
}

// runCmd runs a short command with extra env, bounded by timeout; its process group is
// killed when the time is up or ctx ends. It returns stdout (stderr too on failure).
func runCmd(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return append(out.Bytes(), errb.Bytes()...), err
	}
	return out.Bytes(), nil
}
