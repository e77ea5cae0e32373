package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration"
	"github.com/deployd/deployd/integration/loadgen"
)

// workers is the deployd instances of every server.
const workers = 2

// result is one server's run.
type result struct {
	reloads []int64         // failed requests during each reload
	took    []time.Duration // how long each reload took
	upgrade int64           // during the upgrade; -1 when it did not run
	p50     time.Duration
	err     string // why the run stopped early
}

func (r result) summary() string {
	if r.err != "" {
		return fmt.Sprintf("reloads %v, upgrade %d, error: %s", r.reloads, r.upgrade, r.err)
	}
	return fmt.Sprintf("reloads %v (took %v), upgrade %d, keep-alive p50 %s", r.reloads, roundAll(r.took), r.upgrade, r.p50)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

func (r result) row(s *server, version string) string {
	var per []string
	for _, n := range r.reloads {
		per = append(per, fmt.Sprint(n))
	}
	fails, up := strings.Join(per, " "), "-"
	if r.upgrade >= 0 {
		up = fmt.Sprint(r.upgrade)
	}
	if r.err != "" {
		fails += " (stopped: " + strings.ReplaceAll(r.err, "|", "/") + ")"
	}
	return fmt.Sprintf("| %s | %s | `%s` | %s | %s | %s | %s |", s.name, version, s.ready, s.settings, fails, up,
		r.p50.Round(100*time.Microsecond))
}

// agent is a deployd agent of one server's run.
type agent struct {
	dir, config, socket, bin string
	client                   *api.Client
	cmd                      *exec.Cmd
	done                     chan struct{}
}

func (h *harness) runServer(s *server) (res result) {
	res.upgrade = -1
	a, port, err := h.startAgent(s)
	if a != nil {
		defer a.stop()
	}
	if err != nil {
		res.err = err.Error()
		return res
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	ka, err1 := loadgen.Start(context.Background(), loadgen.Options{URL: url, Clients: h.clients, KeepAlive: true,
		MaxRequests: 10_000_000, MaxDuration: 10 * time.Minute})
	nka, err2 := loadgen.Start(context.Background(), loadgen.Options{URL: url, Clients: h.clients,
		MaxRequests: 10_000_000, MaxDuration: 10 * time.Minute})
	if err := errors.Join(err1, err2); err != nil {
		res.err = err.Error()
		return res
	}
	failed := func() int64 { return ka.Snapshot().Failures + nka.Snapshot().Failures }
	which := (&losses{name: s.name, ka: ka, nka: nka}).tell
	defer func() {
		k, n := ka.Stop(), nka.Stop()
		res.p50 = k.P50
		if k.Failures+n.Failures > 0 {
			errs := append(k.Errors, n.Errors...)
			fmt.Fprintf(os.Stderr, "compat: %s: %d failed, e.g. %s\n", s.name, k.Failures+n.Failures,
				strings.Join(errs[:min(len(errs), 3)], "; "))
		}
	}()
	time.Sleep(time.Second) // a baseline under load before the first reload
	which("before the first reload")
	for i := 1; i <= h.reloads; i++ {
		before := failed()
		if err := a.writeConfig(h, s, port, fmt.Sprintf("v%d", i+1)); err != nil {
			res.err = err.Error()
			return res
		}
		t0 := time.Now()
		out, err := a.cli(h, "reload", "web")
		res.reloads = append(res.reloads, failed()-before)
		res.took = append(res.took, time.Since(t0))
		which(fmt.Sprintf("reload %d", i))
		if err != nil {
			res.err = fmt.Sprintf("reload %d: %v: %s", i, err, lastLine(out))
			return res
		}
	}
	before := failed()
	counted, err := h.upgrade(a)
	if err != nil {
		res.err = err.Error()
	}
	if counted {
		res.upgrade = failed() - before
		which("upgrade")
	}
	return res
}

// upgrade upgrades a's agent to the candidate binary and waits until every
// worker is ready again; counted is false when the upgrade did not run.
func (h *harness) upgrade(a *agent) (counted bool, err error) {
	cand := filepath.Join(a.dir, "deployd-candidate")
	if err := copyFile(h.deploy2, cand); err != nil {
		return false, err
	}
	if out, err := a.cli(h, "upgrade", "--binary", cand); err != nil {
		return false, fmt.Errorf("upgrade: %w: %s", err, lastLine(out))
	}
	if err := a.waitReady(60 * time.Second); err != nil {
		return true, fmt.Errorf("after the upgrade: %w", err)
	}
	return true, nil
}

// losses tells, on stderr, which load lost what since the last tell and how:
// the measured reason a server does not reach 0.
type losses struct {
	name            string
	ka, nka         *loadgen.Load
	lastKA, lastNKA loadgen.Result
}

func (l *losses) tell(what string) {
	k, n := l.ka.Snapshot(), l.nka.Snapshot()
	if d := k.Failures + n.Failures - l.lastKA.Failures - l.lastNKA.Failures; d > 0 {
		fmt.Fprintf(os.Stderr, "compat: %s: %s: %d failed: keep-alive %s; new-connection %s\n", l.name, what, d,
			delta(k, l.lastKA), delta(n, l.lastNKA))
	}
	l.lastKA, l.lastNKA = k, n
}

// delta describes the failures of r since last: how many, of which kind, and
// the errors not seen before.
func delta(r, last loadgen.Result) string {
	seen := map[string]bool{}
	for _, e := range last.Errors {
		seen[e] = true
	}
	var errs []string
	for _, e := range r.Errors {
		if !seen[e] {
			errs = append(errs, e)
		}
	}
	return fmt.Sprintf("%d failed (%d retried after a reused connection failed, %d connect, %d refused) of %d%s",
		r.Failures-last.Failures, r.Retries-last.Retries, r.ConnectErrors-last.ConnectErrors, r.Refused-last.Refused,
		r.Requests-last.Requests, strings.Join(append([]string{""}, errs...), "; "))
}

func (h *harness) startAgent(s *server) (*agent, int, error) {
	dir, err := os.MkdirTemp(h.dir, "srv-")
	if err != nil {
		return nil, 0, err
	}
	_ = os.Chmod(dir, 0o755)
	a := &agent{dir: dir, config: filepath.Join(dir, "deployd.toml"), socket: filepath.Join(dir, "deployd.sock"),
		bin: filepath.Join(dir, "deployd"), done: make(chan struct{})}
	a.client = api.NewClient(a.socket)
	port, err := freePort()
	if err == nil {
		err = copyFile(h.deployd, a.bin) // the agent runs its own copy: the upgrade swaps it
	}
	if err == nil {
		err = a.writeConfig(h, s, port, "v1")
	}
	if err != nil {
		return nil, 0, err
	}
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return nil, 0, err
	}
	a.cmd = exec.Command(a.bin, "agent", "-c", a.config)
	a.cmd.Dir, a.cmd.Stdout, a.cmd.Stderr = dir, log, log
	a.cmd.Env = append(os.Environ(), "DEPLOYD_SOCKET=")
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		return nil, 0, err
	}
	go func() { a.cmd.Wait(); log.Close(); close(a.done) }()
	if err := a.waitReady(60 * time.Second); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "logs", "web.err.log"))
		return a, port, fmt.Errorf("%w; last output: %s", err, lastLine(b))
	}
	return a, port, nil
}

func (a *agent) writeConfig(h *harness, s *server, port int, ver string) error {
	q := make([]string, 0, 8)
	for _, arg := range s.argv(h) {
		q = append(q, fmt.Sprintf("%q", arg))
	}
	cwd := h.appDir()
	if s.npm { // the tutorial app, with the port it is configured with
		cwd = h.nodeDir
		b, err := os.ReadFile(filepath.Join(h.appDir(), "express.js"))
		if err == nil {
			err = os.WriteFile(filepath.Join(cwd, "express.js"), []byte(strings.ReplaceAll(string(b), "3000", fmt.Sprint(port))), 0o644)
		}
		if err != nil {
			return err
		}
	}
	ready := ""
	if !s.npm {
		ready = fmt.Sprintf("ready = %q\n", s.ready)
	}
	body := fmt.Sprintf(`[agent]
socket = %q
state_dir = "state"
log_dir = "logs"

[apps.web]
command = [%s]
cwd = %q
instances = %d
listen = ["tcp://127.0.0.1:%d"]
%sready_timeout = "30s"
stop_timeout = "30s"
env = { APP_VERSION = %q, GOAPP_VERSION = %q, PORT = "%d" }
%s
`, a.socket, strings.Join(q, ", "), cwd, workers, port, ready, ver, ver, port, s.extra)
	return os.WriteFile(a.config, []byte(body), 0o644)
}

// waitReady polls the agent until every worker is ready.
func (a *agent) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := a.client.Status(context.Background(), "web")
		if err == nil && integration.AllReady(st, "web", workers) {
			return nil
		}
		select {
		case <-a.done:
			return errors.New("the agent exited")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workers not ready within %s (status error: %v)", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *agent) cli(h *harness, args ...string) ([]byte, error) {
	cmd := exec.Command(h.deployd, args...)
	cmd.Env = append(os.Environ(), "DEPLOYD_SOCKET="+a.socket, "DEPLOYD_CONFIG="+a.config)
	return cmd.CombinedOutput()
}

// stop ends the agent serving the socket (after an upgrade, not the one
// started) and its workers.
func (a *agent) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	v, err := a.client.Version(ctx)
	cancel()
	if err == nil {
		_ = syscall.Kill(v.PID, syscall.SIGTERM)
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(40 * time.Second)
	for err == nil && processAlive(v.PID) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-a.done:
	case <-time.After(time.Until(deadline)):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
	}
}

func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil && integration.Alive(pid) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func execCommand(argv []string) *exec.Cmd { return exec.Command(argv[0], argv[1:]...) }
