package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// installPM2 installs pm2 from the npm registry into dir (npm install --prefix) and
// returns the path of its CLI and its version.
func installPM2(ctx context.Context, npm, dir string) (bin, version string, err error) {
	out, err := runCmd(ctx, 5*time.Minute, nil, npm, "install", "--prefix", dir, "--no-audit", "--no-fund",
		"--loglevel=error", "pm2")
	if err != nil {
		return "", "", fmt.Errorf("npm install pm2: %w\n%s", err, out)
	}
	return pm2At(dir)
}

// pm2At finds the pm2 CLI installed under prefix. The version comes from its
// package.json: running `pm2 --version` would start a daemon.
func pm2At(prefix string) (bin, version string, err error) {
	bin = filepath.Join(prefix, "node_modules", ".bin", "pm2")
	b, err := os.ReadFile(filepath.Join(prefix, "node_modules", "pm2", "package.json"))
	if err != nil {
		return "", "", fmt.Errorf("pm2 not installed under %s: %w", prefix, err)
	}
	var pkg struct{ Version string }
	if err := json.Unmarshal(b, &pkg); err != nil {
		return "", "", err
	}
	return bin, pkg.Version, nil
}

// pm2System runs the app in PM2 cluster mode, one worker per core, with wait_ready, under
// a PM2 daemon of its own (a fresh PM2_HOME for every start).
type pm2System struct {
	b   *bench
	app appSpec

	p     int
	extra []int  // ports of the app.extraApps apps
	home  string // PM2_HOME
	eco   string
	god   int // the daemon's pid

	poller *pm2Poller
}

func (s *pm2System) name() string    { return "pm2" }
func (s *pm2System) port() int       { return s.p }
func (s *pm2System) managerPID() int { return s.god }

func (s *pm2System) workerPIDs() []int {
	ps, err := s.jlist(context.Background())
	if err != nil {
		return nil
	}
	var pids []int
	for _, p := range ps {
		pids = append(pids, p.PID)
	}
	return pids
}

// pm2 runs the pm2 CLI with this system's PM2_HOME.
func (s *pm2System) pm2(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return runPM2(ctx, s.b.pm2, s.home, timeout, args...)
}

// runPM2 runs the pm2 CLI with PM2_HOME=home. PM2_DISABLE_VERSION_CHECK and the "touch"
// file startPM2Home writes keep pm2 from asking version.pm2.io over the network.
func runPM2(ctx context.Context, bin, home string, timeout time.Duration, args ...string) ([]byte, error) {
	return runCmd(ctx, timeout, []string{"PM2_HOME=" + home, "PM2_DISABLE_VERSION_CHECK=true"}, bin, args...)
}

func (s *pm2System) writeEcosystem(version string) error {
	var apps []any
	for i, port := range append([]int{s.p}, s.extra...) {
		name := "web"
		if i > 0 {
			name = fmt.Sprintf("app%d", i)
		}
		env := map[string]string{"PORT": strconv.Itoa(port), "HOST": "127.0.0.1"}
		for _, kv := range s.app.env(version) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		apps = append(apps, map[string]any{
			"name": name, "script": s.b.appJS, "exec_mode": "cluster", "instances": s.app.instances,
			// Wait for process.send('ready'); listen_timeout stays at its default (3 s).
			"wait_ready": true,
			// SIGINT, then SIGKILL after kill_timeout: far more than the app's drain needs.
			"kill_timeout": 30000,
			"env":          env,
			"out_file":     filepath.Join(s.home, name+"-out.log"),
			"error_file":   filepath.Join(s.home, name+"-err.log"),
			"merge_logs":   true,
		})
	}
	js, err := json.MarshalIndent(map[string]any{"apps": apps}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(s.eco, []byte("module.exports = "+string(js)+";\n"), 0o644)
}

func (s *pm2System) start(ctx context.Context) error {
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
	if s.home, err = os.MkdirTemp(s.b.dir, "pm2home-"); err != nil {
		return err
	}
	s.b.addPM2Home(s.home)
	// Without PM2_HOME/touch, the first pm2 command of a new home reports an "install"
	// to version.pm2.io (lib/Client.js); the benchmark stays on loopback.
	if err := os.WriteFile(filepath.Join(s.home, "touch"), []byte(strconv.FormatInt(time.Now().UnixMilli(), 10)), 0o644); err != nil {
		return err
	}
	s.eco = filepath.Join(s.home, "ecosystem.config.js")
	if err := s.writeEcosystem("v1"); err != nil {
		return err
	}
	out, err := s.pm2(ctx, 2*time.Minute, "start", s.eco)
	if err != nil {
		return fmt.Errorf("pm2 start: %w\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(s.home, "pm2.pid"))
	if err != nil {
		return fmt.Errorf("pm2 daemon pid: %w", err)
	}
	if s.god, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return fmt.Errorf("pm2.pid: %w", err)
	}
	trackPID(s.god, "pm2 daemon")
	deadline := time.Now().Add(60*time.Second + 2*s.app.startupDelay)
	for {
		ps, err := s.jlist(ctx)
		if err == nil && len(ps) == s.app.instances*(1+s.app.extraApps) && allOnline(ps) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pm2: %d workers not online in time: %+v %v", s.app.instances, ps, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pm2Proc is one entry of `pm2 jlist`.
type pm2Proc struct {
	PMID   int `json:"pm_id"`
	PID    int `json:"pid"`
	PM2Env struct {
		Status string `json:"status"`
	} `json:"pm2_env"`
}

func allOnline(ps []pm2Proc) bool {
	for _, p := range ps {
		if p.PM2Env.Status != "online" || p.PID == 0 {
			return false
		}
	}
	return true
}

func (s *pm2System) jlist(ctx context.Context) ([]pm2Proc, error) {
	out, err := s.pm2(ctx, 30*time.Second, "jlist")
	if err != nil {
		return nil, fmt.Errorf("pm2 jlist: %w\n%s", err, out)
	}
	// pm2 may print notices before the JSON.
	if i := strings.IndexByte(string(out), '['); i > 0 {
		out = out[i:]
	}
	var ps []pm2Proc
	if err := json.Unmarshal(out, &ps); err != nil {
		return nil, fmt.Errorf("pm2 jlist: %w", err)
	}
	for _, p := range ps {
		if p.PID > 0 {
			trackPID(p.PID, "pm2 worker")
		}
	}
	return ps, nil
}

// reload is `pm2 reload ecosystem.config.js --update-env` after writing the new version
// into the file; pm2 returns once every worker is replaced.
func (s *pm2System) reload(ctx context.Context, version string) error {
	if err := s.writeEcosystem(version); err != nil {
		return err
	}
	out, err := s.pm2(ctx, 5*time.Minute, "reload", s.eco, "--update-env")
	if err != nil {
		return fmt.Errorf("pm2 reload: %w\n%s", err, out)
	}
	return nil
}

func (s *pm2System) slots(ctx context.Context) (map[int]int, error) {
	if err := s.ensurePoller(); err != nil {
		return nil, err
	}
	ps, err := s.poller.wait(ctx, 30*time.Second, func(ps []pm2Proc) bool {
		return len(ps) == s.app.instances && allOnline(ps)
	})
	if err != nil {
		return nil, err
	}
	m := map[int]int{}
	for _, p := range ps {
		m[p.PMID] = p.PID
	}
	return m, nil
}

// waitReplaced watches the daemon's process list (through pm2's API, polled every 5 ms:
// `pm2 jlist` costs a Node start, ~0.3 s, per look) until slot is online with a new pid.
func (s *pm2System) waitReplaced(ctx context.Context, slot, old int) error {
	if err := s.ensurePoller(); err != nil {
		return err
	}
	ps, err := s.poller.wait(ctx, 60*time.Second, func(ps []pm2Proc) bool {
		for _, p := range ps {
			if p.PMID == slot && p.PID != old && p.PID != 0 && p.PM2Env.Status == "online" {
				return true
			}
		}
		return false
	})
	for _, p := range ps {
		trackPID(p.PID, "pm2 worker")
	}
	return err
}

func (s *pm2System) ensurePoller() error {
	if s.poller != nil {
		return nil
	}
	p, err := startPM2Poller(s.b, s.home)
	s.poller = p
	return err
}

// stop is `pm2 kill` (SIGINT to the workers, which drain, then the daemon exits);
// anything left is killed.
func (s *pm2System) stop() error {
	if s.poller != nil {
		s.poller.close()
		s.poller = nil
	}
	if s.home == "" {
		return nil
	}
	pids := s.workerPIDs()
	out, err := s.pm2(context.Background(), 90*time.Second, "kill")
	if err != nil {
		err = fmt.Errorf("pm2 kill: %w\n%s", err, out)
	}
	// pm2 kill answers before the daemon process is gone.
	all := append(pids, s.god)
	deadline := time.Now().Add(15 * time.Second)
	for anyAlive(all) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range all {
		if pid > 0 && alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if err == nil {
				err = fmt.Errorf("pm2: pid %d outlived pm2 kill", pid)
			}
		}
	}
	s.home = ""
	return err
}

//go:embed pm2poll.js
var pm2PollJS []byte

// pm2Poller is a Node process that lists the daemon's processes through pm2's API every
// 5 ms and prints the list as a JSON line whenever it changes.
type pm2Poller struct {
	p     *proc
	stdin io.WriteCloser

	mu      sync.Mutex
	last    []pm2Proc     // owned by mu
	changed chan struct{} // owned by mu: closed and replaced at each change
	done    chan struct{} // closed when the reader has returned
}

func startPM2Poller(b *bench, home string) (*pm2Poller, error) {
	script := filepath.Join(b.dir, "pm2poll.js")
	if err := os.WriteFile(script, pm2PollJS, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(b.node, script, filepath.Join(b.pm2Prefix, "node_modules", "pm2"))
	cmd.Env = append(os.Environ(), "PM2_HOME="+home, "PM2_DISABLE_VERSION_CHECK=true")
	stdin, err := cmd.StdinPipe() // closed by close: the poller exits at EOF
	if err != nil {
		return nil, err
	}
	p, err := startProc("pm2-poller", cmd, filepath.Join(b.dir, "pm2poll.log"), true)
	if err != nil {
		return nil, err
	}
	pl := &pm2Poller{p: p, changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(pl.done)
		for line := range p.lines {
			var ps []pm2Proc
			if json.Unmarshal([]byte(line), &ps) != nil {
				continue
			}
			pl.mu.Lock()
			pl.last = ps
			close(pl.changed)
			pl.changed = make(chan struct{})
			pl.mu.Unlock()
		}
	}()
	pl.stdin = stdin
	return pl, nil
}

// wait returns the list once cond holds for it.
func (pl *pm2Poller) wait(ctx context.Context, timeout time.Duration, cond func([]pm2Proc) bool) ([]pm2Proc, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		pl.mu.Lock()
		ps, ch := pl.last, pl.changed
		pl.mu.Unlock()
		if ps != nil && cond(ps) {
			return ps, nil
		}
		select {
		case <-ch:
		case <-pl.done:
			return ps, fmt.Errorf("pm2 poller exited: %v", pl.p.err)
		case <-t.C:
			return ps, fmt.Errorf("pm2: condition not met within %v; last list %+v", timeout, ps)
		case <-ctx.Done():
			return ps, ctx.Err()
		}
	}
}

func (pl *pm2Poller) close() {
	pl.stdin.Close()
	_ = pl.p.stop(syscall.SIGTERM, 5*time.Second)
	<-pl.done
}

func anyAlive(pids []int) bool {
	for _, pid := range pids {
		if pid > 0 && alive(pid) {
			return true
		}
	}
	return false
}
