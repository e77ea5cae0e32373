// Package agent is the deployd daemon's core. It owns its lifecycle (a run
// group: upgrader, the edge that serves clients, STATUS= updates, signal
// loop, and one teardown), the set of apps and each app's runtime (its
// running config, its listener leases and one workers.Supervisor), the
// [agent] settings it started with, the state file, and self-upgrades. Its
// operations (Reload, Deploy, Scale, ...) take typed requests and return
// typed results and errors (outcome.go maps them), and report progress as
// workers.Events; it has no HTTP: package agent/control serves them on the
// control socket, with the metrics endpoint.
package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
	"github.com/oklog/run"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
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
	// Edge serves the agent to its clients (package agent/control: the
	// control API on the control socket, the metrics endpoint on metrics,
	// nil when [agent] metrics is off). Without it the agent holds the
	// control socket open but answers nothing (tests of the lifecycle).
	Edge func(a *Agent, control, metrics net.Listener, log hclog.Logger) Edge

	// upgrader replaces tableflip in tests.
	upgrader func(config.Agent) (upgrader, error)
}

// SetupError is an error before the agent served anything: a bad config, a
// busy address, a missing permission. The CLI exits 2 on it.
type SetupError struct{ Err error }

func (e *SetupError) Error() string { return e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// Agent is a running daemon. Its apps belong to apps (appSet), each app's
// running config to its appRT; the [agent] settings and the config path are
// read once at start and never change. Its methods are safe for concurrent
// use.
type Agent struct {
	log      hclog.Logger
	shim     string
	started  time.Time
	socket   string
	path     string       // the config file
	settings config.Agent // [agent], as the agent started with it
	upg      upgrader
	reg      *handoff.Registry // every listener of every app

	apps  appSet
	build *builder // an app's config into what runs it (builder.go); set by setup
	learn *learner // the addresses apps without a listen list learn (learn.go); set by setup

	shutdown     chan struct{} // closed to ask for a shutdown
	shutdownOnce sync.Once
	ready        chan struct{} // closed once the agent serves (after upg.Ready)
	quiet        atomic.Bool   // a new agent that has not taken over: leave the previous one's sockets alone
	tearingDown  atomic.Bool   // set as teardown starts: its workers stop, none is a stray (holders.go)
	upgrades     *upgrades     // this agent's self-upgrades (upgrades.go)
	takeover     *takeover     // a new agent's side of an upgrade (takeover.go)
	holders      *holders      // who holds the apps' sockets after an adopting start (holders.go)
	hooks        *hooks        // before and after hooks; after hooks running or queued (hooks.go)

	state    *stateFile
	releases *release.Store
	// inherited is the previous agent's handover (nil without one): the
	// workers startApps adopts. Set by setup.
	inherited *received
	book      *recordBook                                                 // this agent's record on disk (record.go)
	survivors *survivors                                                  // the workers dead agents left (survivors.go)
	retiring  sync.WaitGroup                                              // afterAdopting in flight
	metrics   net.Listener                                                // [agent] metrics; nil when off (systemd.go)
	newEdge   func(*Agent, net.Listener, net.Listener, hclog.Logger) Edge // Options.Edge

	control *controlSocket // the control socket's path and folder (controlsocket.go)
	// adopting: this start takes workers over (a handoff, or survivors of
	// a dead agent); set by Run, read by afterAdopting (holders.go).
	adopting bool
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
	newUpg := opts.upgrader
	if newUpg == nil {
		newUpg = newFlip
	}
	upg, err := newUpg(cfg.Agent)
	if err != nil {
		return &SetupError{fmt.Errorf("upgrader: %w", err)}
	}
	a := &Agent{
		log: log, shim: shim, started: time.Now(), socket: cfg.Agent.Socket, path: cfg.Path, settings: cfg.Agent,
		upg: upg, shutdown: make(chan struct{}), ready: make(chan struct{}),
		newEdge: opts.Edge,
	}
	// A new agent that gives up before it is ready must not Stop the
	// upgrader: that unlinks the unix sockets the old agent still serves.
	a.quiet.Store(upg.HasParent())
	a.takeover = &takeover{log: log, upg: upg, shim: shim, timeout: cfg.Agent.UpgradeTimeout}
	if upg.HasParent() {
		a.takeover.parent = os.Getppid()
		a.adopting = true
	}
	a.releases = &release.Store{Dir: filepath.Join(cfg.Agent.StateDir, "releases")}
	a.hooks = &hooks{log: log, releases: a.releases}
	a.control = &controlSocket{log: log, path: cfg.Agent.Socket, group: cfg.Agent.SocketGroup}
	a.holders = &holders{log: log, stateDir: cfg.Agent.StateDir, apps: a.apps.list, stopping: &a.tearingDown}
	a.upgrades = &upgrades{log: log, upg: upg, shim: shim, config: cfg.Path, timeout: cfg.Agent.UpgradeTimeout,
		ready: a.ready, apps: a.apps.list, hooks: a.hooks}
	a.book = newRecordBook(cfg.Agent.StateDir, log)
	mine := func() map[string][]workers.Process { return processes(a.apps.list()) }
	a.survivors = &survivors{log: log, stateDir: cfg.Agent.StateDir, mine: mine, parent: upg,
		upgradeTimeout: cfg.Agent.UpgradeTimeout}
	socks := activation(log, upg.HasParent())
	if !upg.HasParent() {
		// Workers a killed agent left: their sockets first (still bound),
		// retired once this agent's own workers are ready (survivors.go).
		a.adopting = len(a.survivors.collect()) > 0
		a.survivors.endDead()
		socks = append(socks, a.survivors.sockets()...)
	}
	a.reg = handoff.NewRegistry(upg.Fds(), socks, log)
	// Signals first, so a SIGTERM during startup is not lost.
	sigs, stopSigs := watchSignals()
	defer stopSigs()

	ctl, err := a.control.listen(upg.Fds())
	if err == nil {
		err = a.setup(cfg)
		if err != nil {
			ctl.Close()
		}
	}
	if err != nil {
		a.teardown(false, false)
		return &SetupError{err}
	}
	err = a.group(ctl, sigs, opts.Ready).Run()
	handedOff := errors.Is(err, ErrHandedOff)
	a.teardown(handedOff, !handedOff && !a.quiet.Load())
	switch {
	case handedOff:
		a.log.Info("agent stopped after handing off")
	case errors.Is(err, errStopped):
		a.log.Info("agent stopped")
		return nil
	default:
		a.log.Error("agent stopped", "error", err)
	}
	return err
}

// errStopped ends the run group on SIGTERM, SIGINT or `deployd shutdown`.
var errStopped = errors.New("agent: stopped")

// group is the agent's lifecycle: the upgrader (a handoff ends it), the
// edge (the control server and the metrics endpoint), the STATUS= updates
// and the agent loop (startup, then signals). The first to return stops the
// others, in this order.
func (a *Agent) group(ctl net.Listener, sigs <-chan os.Signal, onReady func(*Agent)) *run.Group {
	var g run.Group
	stopUpg := make(chan struct{})
	g.Add(func() error {
		select {
		case <-a.upg.Exit():
			a.log.Info("new agent is ready; it has the handed-over workers, this one stops the rest and exits")
			return ErrHandedOff
		case <-stopUpg:
			return nil
		}
	}, func(err error) {
		close(stopUpg)
		if !errors.Is(err, ErrHandedOff) && !a.quiet.Load() {
			notify(daemon.SdNotifyStopping)
			// Stop listening on the control socket at once (tableflip
			// holds a copy) and cancel an upgrade in flight.
			a.upg.Stop()
		}
	})
	edge := a.edge(ctl)
	g.Add(func() error {
		if err := edge.Serve(); err != nil {
			a.log.Error("control server stopped", "error", err)
		}
		return errStopped // as a shutdown: the agent stops and exits 0
	}, func(error) { edge.Stop() })
	stopStatus := make(chan struct{})
	g.Add(func() error { a.statusUpdates(stopStatus); return nil }, func(error) { close(stopStatus) })
	stopRec := make(chan struct{})
	g.Add(func() error {
		// From the start, so that an agent killed while its workers get
		// ready leaves a record naming them (the next agent adopts them);
		// after an upgrade only once ready: until then the previous agent,
		// still alive, records the workers it handed over.
		if a.upg.HasParent() {
			select {
			case <-a.ready:
			case <-stopRec:
				return nil
			}
		}
		a.book.run(stopRec, func() map[string][]workers.Process { return processes(a.apps.list()) })
		return nil
	}, func(error) { close(stopRec) })
	stopLoop := make(chan struct{})
	g.Add(func() error { return a.loop(sigs, stopLoop, onReady) }, func(error) { close(stopLoop) })
	return &g
}

// teardown is the one way out: it stops every app's workers (after a
// handoff only those the new agent did not get: it adopted the others), stops the metrics
// server, closes the agent's copies of the listeners and log files, and
// stops the upgrader, except in a new agent that gave up (that would unlink
// the sockets the previous agent serves). With removeFiles (a real
// shutdown) it also removes the socket files; after a handoff the new agent
// serves them.
func (a *Agent) teardown(handedOff, removeFiles bool) {
	a.tearingDown.Store(true)
	a.hooks.close() // after hooks end (each within after_timeout) before their app's workers stop
	a.upgrades.wait()
	eachApp(a.apps.list(), func(rt *appRT) {
		if handedOff {
			rt.sup.Release() // the handed-over workers run on under the new agent
		} else {
			stopApp(rt, a.quiet.Load())
		}
	})
	if a.metrics != nil {
		a.metrics.Close() // our copy: tableflip, or the next agent, holds its own
	}
	if removeFiles {
		a.control.remove()
		a.reg.RemoveSocketFiles()
	}
	for _, rt := range a.apps.list() {
		rt.closeLogs()
	}
	if err := a.reg.Close(); err != nil {
		a.log.Warn("close listeners", "error", err)
	}
	if handedOff || !a.quiet.Load() {
		a.upg.Stop()
	}
	a.retiring.Wait()
	if !a.takeover.orphaned {
		a.book.remove() // every worker is stopped, or recorded by the next agent
	}
}

// loop starts the apps, tells systemd and the previous agent that this one
// serves, then handles signals until SIGTERM, SIGINT, `deployd shutdown` or
// stop. A new agent whose workers do not get ready gives up, so that the
// previous agent keeps serving.
func (a *Agent) loop(sigs <-chan os.Signal, stop <-chan struct{}, onReady func(*Agent)) error {
	t0 := time.Now()
	stopped, err := a.startWatchingSignals(sigs, stop)
	if stopped {
		a.log.Info("agent stopped during startup")
		return errStopped
	}
	if err != nil && a.upg.HasParent() {
		a.log.Error("new agent: workers not ready; giving up so that the previous agent keeps serving", "error", err)
		return fmt.Errorf("upgrade abandoned: %w", err)
	}
	a.log.Info("agent ready", "apps", len(a.apps.list()), "startup", time.Since(t0).Round(time.Millisecond),
		"version", version.String(), "pid", os.Getpid(), "socket", a.socket)
	// Recorded before the previous agent may exit: if this one is killed
	// from now on, the next one finds every worker (survivors.go).
	if err := a.book.write(processes(a.apps.list())); err != nil {
		a.log.Warn("record the running workers", "error", err)
	}
	a.retiring.Go(a.afterAdopting)
	a.takeover.hold(true)
	// systemd learns the new main pid before the previous agent may exit.
	notify(daemon.SdNotifyReady + "\nMAINPID=" + fmt.Sprint(os.Getpid()) + "\nSTATUS=serving")
	a.takeover.hold(false)
	if err := a.upg.Ready(); err != nil {
		if err := a.takeover.lost(err); err != nil {
			return err
		}
	}
	a.quiet.Store(false)
	close(a.ready)
	// Startup's garbage (config, records, the handoff) is freed, but the
	// runtime hands its pages back to the kernel only slowly: idle, the
	// agent read 0.3-0.4 MiB less with this (BENCHMARKS.md).
	debug.FreeOSMemory()
	if onReady != nil {
		onReady(a)
	}
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				a.upgrades.sighup()
			case syscall.SIGUSR1:
				rotateAll(a.apps.list())
			default:
				a.log.Info("signal received, stopping", "signal", sig)
				return errStopped
			}
		case <-a.shutdown:
			a.log.Info("shutdown requested")
			return errStopped
		case <-stop:
			return nil
		}
	}
}

// stopApp stops rt's workers; in a new agent that has not taken over
// (quiet) it leaves those it adopted to the previous agent, which keeps
// them.
func stopApp(rt *appRT, quiet bool) {
	if quiet {
		rt.sup.LetGo()
		return
	}
	rt.sup.Stop()
}

// ErrHandedOff is returned by Run when a new agent took over (upgrade).
var ErrHandedOff = errors.New("agent: handed off to a new agent")

// Shutdown makes Run stop. Safe to call many times.
func (a *Agent) Shutdown() {
	a.shutdownOnce.Do(func() { close(a.shutdown) })
}

// rotateAll reopens (rotates) the log files of every app of rts (SIGUSR1).
func rotateAll(rts []*appRT) {
	for _, rt := range rts {
		if err := rt.rotateLogs(); err != nil {
			rt.log.Error("rotate logs", "error", err)
		}
	}
}

// Socket returns the control socket path.
func (a *Agent) Socket() string { return a.socket }

// Settings are the [agent] settings the agent started with.
func (a *Agent) Settings() config.Agent { return a.settings }
