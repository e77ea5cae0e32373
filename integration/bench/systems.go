package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// A system is one way of running the app: plain processes, PM2, deployd.
type system interface {
	name() string
	// start returns when every worker is ready.
	start(ctx context.Context) error
	// stop stops everything it started; safe to call twice.
	stop() error
	port() int
	// managerPID is the manager's process (deployd agent, PM2 daemon), 0 if none.
	managerPID() int
	workerPIDs() []int
}

// reloader is a system that can replace its workers with a new version.
type reloader interface {
	system
	// reload replaces every worker with version and returns when done.
	reload(ctx context.Context, version string) error
}

// crashable is a system that restarts a killed worker.
type crashable interface {
	system
	// slots returns the worker pid of each slot.
	slots(ctx context.Context) (map[int]int, error)
	// waitReplaced returns once slot runs a ready worker other than old.
	waitReplaced(ctx context.Context, slot, old int) error
}

// appSpec is what runs: the Node app or the Go test app.
type appSpec struct {
	kind         string // "node" or "go"
	instances    int
	startupDelay time.Duration
	extraApps    int // more apps beside "web" (app1, app2...), each with instances workers and a port of its own
	// balance and spares are the deployd app's keys of the same names
	// ("" and 0: left out, deployd's defaults); PM2 has neither.
	balance string
	spares  int
}

func (a appSpec) env(version string) []string {
	if a.kind == "go" {
		return []string{"TESTAPP_VERSION=" + version}
	}
	return []string{"APP_VERSION=" + version, "STARTUP_DELAY_MS=" + strconv.FormatInt(a.startupDelay.Milliseconds(), 10)}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls GET url until it answers 200.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %v (last error %v)", url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// bareSystem is the app without a manager: one process listening itself, or (shared)
// N processes sharing one listening socket the harness opened — the floor. A shared one
// can do a rolling replace by hand, which is the floor of a reload.
type bareSystem struct {
	b      *bench
	label  string
	app    appSpec
	shared bool

	p       int
	lf      *os.File // the shared listening socket
	workers []*proc  // by slot
	// Of the last reload: each new worker's time from spawn to ready, each old
	// worker's time from SIGTERM to exit.
	startups, drains []time.Duration
}

func (s *bareSystem) name() string    { return s.label }
func (s *bareSystem) port() int       { return s.p }
func (s *bareSystem) managerPID() int { return 0 }
func (s *bareSystem) workerPIDs() []int {
	var pids []int
	for _, w := range s.workers {
		pids = append(pids, w.pid())
	}
	return pids
}

func (s *bareSystem) start(ctx context.Context) error {
	var err error
	if s.p, err = freePort(); err != nil {
		return err
	}
	if s.shared {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(s.p))
		if err != nil {
			return err
		}
		s.lf, err = l.(*net.TCPListener).File() // a dup of the socket, in blocking mode
		l.Close()
		if err != nil {
			return err
		}
	}
	n := 1
	if s.shared {
		n = s.app.instances
	}
	s.workers = make([]*proc, n)
	for i := range n {
		if s.workers[i], err = s.spawn(ctx, i, "v1"); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts the worker of slot and waits until it is ready.
func (s *bareSystem) spawn(ctx context.Context, slot int, version string) (*proc, error) {
	var cmd *exec.Cmd
	if s.app.kind == "go" {
		cmd = exec.Command(s.b.testapp)
		if !s.shared {
			cmd.Args = append(cmd.Args, "-listen", "127.0.0.1:"+strconv.Itoa(s.p))
		}
	} else {
		cmd = exec.Command(s.b.node, s.b.appJS)
	}
	cmd.Env = append(os.Environ(), s.app.env(version)...)
	cmd.Env = append(cmd.Env, "PORT="+strconv.Itoa(s.p), "DEPLOYD_WORKER="+strconv.Itoa(slot))
	if s.shared {
		cmd.ExtraFiles = []*os.File{s.lf}
		cmd.Env = append(cmd.Env, "LISTEN_FDS=1")
	}
	p, err := startProc(fmt.Sprintf("%s[%d]", s.label, slot), cmd, filepath.Join(s.b.dir, s.label+".log"), true)
	if err != nil {
		return nil, err
	}
	timeout := 30*time.Second + s.app.startupDelay
	if s.app.kind == "go" {
		err = waitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/", s.p), timeout)
	} else {
		err = p.waitLine(ctx, "listening", timeout)
	}
	if err != nil {
		_ = p.stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	return p, nil
}

// reload is the rolling replace of the floor: per slot, start the new worker, wait
// until it is ready, then SIGTERM the old one and wait until it has exited.
func (s *bareSystem) reload(ctx context.Context, version string) error {
	if !s.shared {
		return fmt.Errorf("%s cannot reload", s.label)
	}
	s.startups, s.drains = nil, nil
	for i, old := range s.workers {
		t0 := time.Now()
		nw, err := s.spawn(ctx, i, version)
		if err != nil {
			return err
		}
		t1 := time.Now()
		s.workers[i] = nw
		err = old.stop(syscall.SIGTERM, 60*time.Second)
		s.startups = append(s.startups, t1.Sub(t0))
		s.drains = append(s.drains, time.Since(t1))
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *bareSystem) stop() error {
	var firstErr error
	for _, w := range s.workers {
		if w == nil {
			continue
		}
		if err := w.stop(syscall.SIGTERM, 30*time.Second); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if s.lf != nil {
		s.lf.Close()
		s.lf = nil
	}
	return firstErr
}
