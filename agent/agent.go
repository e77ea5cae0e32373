// Package agent is the deployd daemon: it loads the config, opens (or
// inherits) every listener, runs one workers.Supervisor per app, serves the
// control API on a Unix socket, and handles signals and self-upgrades.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cloudflare/tableflip"
	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/release"
)

// Options configure Run.
type Options struct {
	ConfigPath string
	// Socket overrides the config's control socket.
	Socket string
	Logger hclog.Logger
	// Ready, when set, is called once every app's workers are ready and the
	// control socket answers (used by `deployd demo` to print what to try).
	Ready func(a *Agent)
}

// SetupError is an error before the agent served anything: a bad config, a
// busy address, a missing permission. The CLI exits 2 on it.
type SetupError struct{ Err error }

func (e *SetupError) Error() string { return e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// Agent is a running daemon. mu guards cfg, apps and listeners.
type Agent struct {
	log     hclog.Logger
	shim    string
	started time.Time
	socket  string
	upg     *tableflip.Upgrader

	mu         sync.Mutex
	cfg        *config.Config
	apps       map[string]*appRT
	listeners  map[string]*handoff.Listener // by handoff.Key
	pending    map[string]int               // listeners pinned by operations in flight
	generation int

	shutdown     chan struct{} // closed to ask for a shutdown
	shutdownOnce sync.Once
	upgrading    sync.Mutex     // held while an upgrade runs
	upgWG        sync.WaitGroup // SIGHUP upgrades in flight

	state    *stateFile
	releases *release.Store
	sys      sysState // socket activation, STATUS= updates, metrics (systemd.go, metrics.go)
}

// Run runs the agent until SIGTERM/SIGINT, `deployd shutdown`, or a
// successful handoff to a new agent. It returns a *SetupError when it could
// not start.
func Run(opts Options) error {
	log := opts.Logger
	if log == nil {
		log = hclog.Default()
	}
	cfg, shim, err := load(opts)
	if err != nil {
		return &SetupError{err}
	}
	upg, err := tableflip.New(tableflip.Options{UpgradeTimeout: cfg.Agent.UpgradeTimeout, PIDFile: cfg.Agent.PIDFile})
	if err != nil {
		return &SetupError{fmt.Errorf("upgrader: %w", err)}
	}
	// A new agent that gives up before it is ready must not Stop the
	// upgrader: that unlinks the unix sockets the old agent still serves.
	quitQuietly := upg.HasParent()
	defer func() {
		if !quitQuietly {
			upg.Stop()
		}
	}()

	a := &Agent{
		log: log, shim: shim, started: time.Now(), socket: cfg.Agent.Socket, upg: upg,
		cfg: cfg, apps: map[string]*appRT{},
		listeners: map[string]*handoff.Listener{}, shutdown: make(chan struct{}),
	}
	a.loadActivation() // sockets from systemd socket activation
	defer a.stopSys()
	// Signals first, so a SIGTERM during startup is not lost.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	ctl, err := a.listenControl(cfg)
	if err != nil {
		return &SetupError{err}
	}
	if err := a.setup(cfg); err != nil {
		a.closeAll()
		return &SetupError{err}
	}
	srv := a.newServer()
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(controlListener(ctl)) }()

	t0 := time.Now()
	stopped, startErr := a.startWatchingSignals(sigs)
	if stopped {
		// SIGTERM, SIGINT or `deployd shutdown` while the workers started.
		quitQuietly = upg.HasParent()
		srv.Close()
		a.closeAll()
		if !quitQuietly {
			a.removeSocketFiles()
		}
		a.log.Info("agent stopped during startup")
		return nil
	}
	if startErr != nil && upg.HasParent() {
		a.log.Error("new agent: workers not ready; giving up so that the previous agent keeps serving", "error", startErr)
		quitQuietly = true
		srv.Close()
		a.stopApps()
		a.closeAll()
		return fmt.Errorf("upgrade abandoned: %w", startErr)
	}
	a.log.Info("agent ready", "apps", len(cfg.AppNames), "startup", time.Since(t0).Round(time.Millisecond),
		"version", version.String(), "pid", os.Getpid(), "socket", a.socket)
	// systemd learns the new main pid before the previous agent may exit.
	sdNotify("READY=1\nMAINPID=" + fmt.Sprint(os.Getpid()) + "\nSTATUS=serving")
	if err := upg.Ready(); err != nil {
		a.log.Error("tell the previous agent we are ready", "error", err)
	} else {
		quitQuietly = false
	}
	a.startStatusUpdates()
	if opts.Ready != nil {
		opts.Ready(a)
	}

	handedOff := a.loop(sigs, serveDone)
	return a.stop(srv, handedOff)
}

// load loads the config and resolves the agent's own binary once: it is
// the workers' shim and what a handoff starts. tableflip starts os.Args[0],
// so that becomes the resolved path (after a swap /proc/self/exe names the
// backup, minio/minio#14778).
func load(opts Options) (*config.Config, string, error) {
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return nil, "", err
	}
	if opts.Socket != "" {
		cfg.Agent.Socket = opts.Socket
	}
	shim, err := os.Executable()
	if err == nil {
		shim, err = filepath.EvalSymlinks(shim)
	}
	if err != nil {
		return nil, "", fmt.Errorf("find own binary: %w", err)
	}
	os.Args[0] = shim
	return cfg, shim, nil
}

// loop runs until a signal, `deployd shutdown`, a handoff or a failure of
// the control server asks the agent to stop; it reports a handoff.
func (a *Agent) loop(sigs <-chan os.Signal, serveDone <-chan error) (handedOff bool) {
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				a.upgWG.Add(1)
				go func() {
					defer a.upgWG.Done()
					a.upgradeAsync()
				}()
			case syscall.SIGUSR1:
				a.rotateLogs()
			default:
				a.log.Info("signal received, stopping", "signal", sig)
				return false
			}
		case <-a.shutdown:
			a.log.Info("shutdown requested")
			return false
		case <-a.upg.Exit():
			a.log.Info("new agent is ready; draining this one's workers")
			return true
		case err := <-serveDone:
			a.log.Error("control server stopped", "error", err)
			return false
		}
	}
}

// stop refuses new control requests, drains every worker and releases the
// agent's sockets; after a handoff the sockets stay with the new agent.
func (a *Agent) stop(srv *http.Server, handedOff bool) error {
	a.stopStatusUpdates()
	if !handedOff {
		sdNotify("STOPPING=1")
		// Stop listening on the control socket at once (tableflip holds a
		// copy) and cancel an upgrade in flight.
		a.upg.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(ctx)
	cancel()
	a.upgWG.Wait()
	a.stopApps()
	a.closeAll()
	if handedOff {
		a.log.Info("agent stopped after handing off")
		return ErrHandedOff
	}
	a.removeSocketFiles()
	a.log.Info("agent stopped")
	return nil
}

// ErrHandedOff is returned by Run when a new agent took over (upgrade).
var ErrHandedOff = errors.New("agent: handed off to a new agent")

// requestShutdown makes Run stop. Safe to call many times.
func (a *Agent) requestShutdown() {
	a.shutdownOnce.Do(func() { close(a.shutdown) })
}

// listenControl opens (or inherits) the control socket, mode 0600 or 0660
// with socket_group.
func (a *Agent) listenControl(cfg *config.Config) (net.Listener, error) {
	path := cfg.Agent.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if ln, err := a.upg.Fds.Listener("unix", path); err == nil && ln != nil {
		return ln, nil // inherited from the previous agent
	}
	if _, err := os.Lstat(path); err == nil {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another deployd agent is running there; "+
				"stop it (`deployd shutdown`) or set [agent] socket to another path", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("control socket %s: %w; another agent may own it: check, then remove the file", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("control socket %s: remove stale socket: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	ln, err := a.upg.Fds.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if g := cfg.Agent.SocketGroup; g != "" {
		gid, err := lookupGroup(g)
		if err == nil {
			err = os.Chown(path, -1, gid)
		}
		if err == nil {
			err = os.Chmod(path, 0o660)
		}
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("control socket %s: socket_group %q: %w", path, g, err)
		}
	}
	return ln, nil
}

// setup opens every app's listeners and the notify socket. Nothing runs yet.
func (a *Agent) setup(cfg *config.Config) error {
	for _, d := range []string{cfg.Agent.StateDir, cfg.Agent.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	var err error
	if a.state, err = loadState(cfg.Agent.StateDir); err != nil {
		return err
	}
	a.releases = &release.Store{Dir: filepath.Join(cfg.Agent.StateDir, "releases")}
	for _, name := range cfg.AppNames {
		rt, err := a.newApp(cfg.Apps[name])
		if err != nil {
			return fmt.Errorf("app %s: %w", name, err)
		}
		a.apps[name] = rt
	}
	return a.afterSetup(cfg) // unused systemd sockets, metrics server
}

// startWatchingSignals runs startApps while still answering SIGTERM, SIGINT
// and `deployd shutdown`: then it stops the workers (which ends the wait for
// readiness at once) and reports stopped. SIGHUP is ignored until ready (a
// handoff needs a ready agent); SIGUSR1 rotates logs as usual.
func (a *Agent) startWatchingSignals(sigs <-chan os.Signal) (stopped bool, err error) {
	done := make(chan error, 1)
	go func() { done <- a.startApps() }()
	for {
		select {
		case err := <-done:
			return false, err
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				a.log.Warn("SIGHUP ignored: the agent is still starting its workers")
				continue
			case syscall.SIGUSR1:
				a.rotateLogs()
				continue
			}
			a.log.Info("signal received during startup, stopping", "signal", sig)
		case <-a.shutdown:
			a.log.Info("shutdown requested during startup")
		}
		a.stopApps()
		<-done
		return true, nil
	}
}

// startApps starts every app's workers in parallel and waits for readiness.
// The error names the apps whose workers were not all ready.
func (a *Agent) startApps() error {
	a.mu.Lock()
	rts := make([]*appRT, 0, len(a.apps))
	for _, rt := range a.apps {
		rts = append(rts, rt)
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(rts))
	for i, rt := range rts {
		if a.state.get(rt.name).Stopped {
			a.log.Info("app stopped by `deployd stop`; not starting it", "app", rt.name)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			if err := rt.sup.Start(); err != nil {
				a.log.Error("app started with errors", "app", rt.name, "error", err)
				errs[i] = fmt.Errorf("app %s: %w", rt.name, err)
				return
			}
			a.log.Info("app ready", "app", rt.name, "workers", rt.sup.Spec().Instances,
				"in", time.Since(t).Round(time.Millisecond))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (a *Agent) stopApps() {
	a.mu.Lock()
	rts := make([]*appRT, 0, len(a.apps))
	for _, rt := range a.apps {
		rts = append(rts, rt)
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, rt := range rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rt.sup.Stop()
		}()
	}
	wg.Wait()
}

// closeAll closes the agent's copies of listeners, the notify socket and
// log files.
func (a *Agent) closeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rt := range a.apps {
		rt.closeLogs()
	}
	for _, l := range a.listeners {
		l.Close()
	}
}

// removeSocketFiles removes the app unix sockets after a real shutdown (not
// after a handoff, where the new agent serves them).
func (a *Agent) removeSocketFiles() {
	_ = os.Remove(a.socket)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.listeners {
		if l.Network == "unix" && !l.Inherited {
			_ = os.Remove(l.Address)
		}
	}
}

func (a *Agent) rotateLogs() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rt := range a.apps {
		if err := rt.rotateLogs(); err != nil {
			a.log.Error("rotate logs", "app", rt.name, "error", err)
		}
	}
}

// sdNotify sends a message to systemd when it gave us NOTIFY_SOCKET.
func sdNotify(msg string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = c.Write([]byte(msg))
}

// Socket returns the control socket path.
func (a *Agent) Socket() string { return a.socket }

// Config returns the current config.
func (a *Agent) Config() *config.Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

// newServer returns the control HTTP server.
func (a *Agent) newServer() *http.Server {
	return &http.Server{
		Handler:           a.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext:       a.connContext,
		ErrorLog:          a.log.Named("control").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
}
