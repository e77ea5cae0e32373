// Package workers runs an app's pool of worker processes: it spawns them
// with the app's listeners, waits for readiness, restarts crashed workers with
// backoff, replaces them in a rolling or blue-green reload, captures their
// output and reports per-process stats. It knows nothing of the control
// protocol.
package workers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/procfs"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers/logs"
	"github.com/deployd/deployd/workers/nodejs"
)

// Spec is what a generation of workers runs.
type Spec struct {
	Release    string
	Generation int
	Argv       []string
	Dir        string
	Env        []string
	Credential *syscall.Credential
	// Listeners become the workers' fds 3, 4, ...
	Listeners []*handoff.Listener

	Instances    int
	Ready        config.Ready
	ReadyTimeout time.Duration
	StopSignal   syscall.Signal
	StopTimeout  time.Duration
	Restart      config.Restart
	MaxSurge     int
	// MaxMemory (bytes) and Watchdog, when > 0, make the supervisor replace
	// a worker over the limit or silent for longer, the graceful way.
	MaxMemory int64
	Watchdog  time.Duration
	// CPUAffinity pins worker slot i to usable CPU i mod n.
	CPUAffinity bool
	// Node, when set, starts the workers with deployd's Node.js preload.
	Node *nodejs.Spec
}

// AppState is the state of an app's pool.
type AppState string

// App states.
const (
	AppStarting  AppState = "starting"
	AppRunning   AppState = "running"
	AppReloading AppState = "reloading"
	AppErrored   AppState = "errored" // crashed max_restarts times within window; no more restarts
	AppStopped   AppState = "stopped"
	AppStopping  AppState = "stopping"
)

// ErrBusy is returned when an operation is asked while another runs.
var ErrBusy = errors.New("workers: another reload, restart or scale of this app is running")

// Options are the fixed parts of a supervisor.
type Options struct {
	App      string
	Shim     string // the deployd binary (LISTEN_PID shim)
	Out, Err *logs.Sink
	Logger   hclog.Logger
}

// Supervisor keeps one app's workers running. mu guards the slots and state;
// op serializes the operations that replace workers (reload, restart, scale).
type Supervisor struct {
	opts Options
	log  hclog.Logger
	fs   procfs.FS

	op sync.Mutex

	mu        sync.Mutex
	spec      *Spec
	slots     []*slot
	state     AppState
	lastExit  string
	lastLines []string
	closing   chan struct{}
	closed    bool
	ctr       counters // for metrics (counters.go)
	// monitoring is set once the max_memory/watchdog goroutine runs.
	monitoring bool

	wg sync.WaitGroup // watch goroutines
}

type slot struct {
	index   int
	spec    *Spec     // the version this slot should run
	cur     *Worker   // nil when none runs
	extra   []*Worker // new workers not yet swapped in, old ones draining
	backoff time.Duration
	// restarts counts crash restarts of this slot; crashes are the recent
	// ones, within the restart window (max_restarts applies per slot, as
	// PM2's does per process, so one event that kills every worker does not
	// error the app).
	restarts int
	crashes  []time.Time
	// replacements by the monitor.
	memoryReplacements, watchdogReplacements int
}

// New returns a supervisor with no workers; call Start.
func New(opts Options, spec *Spec) *Supervisor {
	fs, _ := procfs.NewDefaultFS()
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	return &Supervisor{
		opts: opts, log: opts.Logger.Named(opts.App), fs: fs,
		spec: spec, state: AppStopped, closing: make(chan struct{}),
	}
}

// Spec returns the spec the app is (being) moved to.
func (s *Supervisor) Spec() *Spec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spec
}

func (s *Supervisor) args() spawnArgs {
	return spawnArgs{
		shim: s.opts.Shim, out: s.opts.Out, err: s.opts.Err, app: s.opts.App,
	}
}

// Start starts spec.Instances workers and waits until all are ready or
// ready_timeout passes. Workers that fail are restarted by the crash policy;
// the error says which were not ready.
func (s *Supervisor) Start() error {
	s.op.Lock()
	defer s.op.Unlock()
	return s.startAll(s.Spec())
}

func (s *Supervisor) startAll(spec *Spec) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrCanceled
	}
	s.state = AppStarting
	s.spec = spec
	s.slots = make([]*slot, spec.Instances)
	for i := range s.slots {
		s.slots[i] = &slot{index: i, spec: spec, backoff: spec.Restart.Backoff}
	}
	slots := append([]*slot(nil), s.slots...)
	s.mu.Unlock()

	var started []*Worker
	var errs []error
	for _, sl := range slots {
		w, err := s.spawnInto(sl, spec)
		if err != nil {
			// The crash policy retries it like a worker that exited at once.
			errs = append(errs, fmt.Errorf("worker %d: %w", sl.index, err))
			dw := deadWorker(sl.index, spec, err)
			s.mu.Lock()
			sl.cur = dw
			s.mu.Unlock()
			s.watch(sl, dw)
			continue
		}
		started = append(started, w)
	}
	deadline := time.Now().Add(spec.ReadyTimeout)
	for _, w := range started {
		if err := waitReady(w, time.Until(deadline), s.closing); err != nil {
			if nr, ok := err.(*NotReadyError); ok && !nr.Exited {
				nr.Timeout = spec.ReadyTimeout
			}
			errs = append(errs, err)
		}
	}
	s.mu.Lock()
	if s.state == AppStarting {
		s.state = AppRunning
	}
	s.mu.Unlock()
	s.ensureMonitor()
	return errors.Join(errs...)
}

// spawnInto starts a worker as sl's current one and watches it.
func (s *Supervisor) spawnInto(sl *slot, spec *Spec) (*Worker, error) {
	w, err := spawn(s.args(), spec, sl.index)
	if err != nil {
		return nil, err
	}
	s.log.Info("worker started", "worker", sl.index, "pid", w.PID, "release", spec.Release)
	s.mu.Lock()
	sl.cur = w
	s.mu.Unlock()
	s.watch(sl, w)
	return w, nil
}

// watch restarts sl when w, its current worker, exits on its own.
func (s *Supervisor) watch(sl *slot, w *Worker) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-w.Done()
		s.onExit(sl, w)
	}()
}

func (s *Supervisor) onExit(sl *slot, w *Worker) {
	s.mu.Lock()
	if s.closed || sl.cur != w || s.state == AppStopped || s.state == AppStopping {
		s.mu.Unlock()
		return
	}
	desc := w.ExitDescription()
	s.lastExit = fmt.Sprintf("worker %d (pid %d): %s", sl.index, w.PID, desc)
	s.lastLines = w.LastLines()
	spec := sl.spec
	now := time.Now()
	if now.Sub(w.Started) >= spec.Restart.StableAfter {
		sl.backoff = spec.Restart.Backoff
	}
	sl.crashes = append(sl.crashes, now)
	for len(sl.crashes) > 0 && now.Sub(sl.crashes[0]) > spec.Restart.Window {
		sl.crashes = sl.crashes[1:]
	}
	if len(sl.crashes) > spec.Restart.MaxRestarts {
		s.state = AppErrored
		crashes, last := len(sl.crashes), s.lastExit // guarded by mu
		s.mu.Unlock()
		s.log.Error("app errored: too many crashes, not restarting; fix it and run `deployd restart`",
			"crashes", crashes, "window", spec.Restart.Window, "last", last)
		return
	}
	delay := jitter(sl.backoff)
	sl.backoff = min(sl.backoff*2, spec.Restart.MaxBackoff)
	s.mu.Unlock()

	s.log.Warn("worker exited, restarting", "worker", sl.index, "pid", w.PID, "status", desc, "in", delay)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing:
		return
	}
	s.mu.Lock()
	if s.closed || sl.cur != w || s.state == AppErrored || s.state == AppStopped {
		s.mu.Unlock()
		return
	}
	spec = sl.spec
	s.mu.Unlock()
	nw, err := spawn(s.args(), spec, sl.index)
	if err != nil {
		s.log.Error("restart failed", "worker", sl.index, "error", err)
		nw = deadWorker(sl.index, spec, err)
	} else {
		s.log.Info("worker restarted", "worker", sl.index, "pid", nw.PID, "release", spec.Release)
	}
	s.mu.Lock()
	if sl.cur != w || s.closed {
		s.mu.Unlock()
		if nw.proc != nil {
			nw.Stop(spec.StopSignal, spec.StopTimeout, Stopping)
		}
		return
	}
	sl.cur = nw
	sl.restarts++
	s.ctr.restarted()
	s.mu.Unlock()
	s.watch(sl, nw)
}

// deadWorker stands for a worker that could not be started, so the crash
// policy counts it like one that exited at once.
func deadWorker(slotIdx int, spec *Spec, err error) *Worker {
	w := &Worker{Slot: slotIdx, Release: spec.Release, Generation: spec.Generation,
		Started: time.Now(), tail: logs.NewTail(1), ready: make(chan struct{}),
		exited: make(chan struct{}), state: Exited, exitErr: err}
	w.tail.Add(err.Error())
	close(w.exited)
	return w
}

// jitter spreads d by ±20 %.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Stop stops every worker (stop signal, then SIGKILL of its group after
// stop_timeout) and returns when all are gone. Safe to call twice.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	s.state = AppStopping
	s.mu.Unlock()
	s.op.Lock() // wait for a running operation to notice closing
	defer s.op.Unlock()
	s.stopAll(Stopping)
	s.wg.Wait()
	s.mu.Lock()
	s.state = AppStopped
	s.mu.Unlock()
}

// stopAll stops every worker in parallel and clears the slots.
func (s *Supervisor) stopAll(state State) {
	s.mu.Lock()
	type victim struct {
		w    *Worker
		spec *Spec
	}
	var vs []victim
	for _, sl := range s.slots {
		if sl.cur != nil {
			vs = append(vs, victim{sl.cur, sl.spec})
		}
		for _, w := range sl.extra {
			vs = append(vs, victim{w, sl.spec})
		}
		sl.cur, sl.extra = nil, nil
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, v := range vs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v.w.Stop(v.spec.StopSignal, v.spec.StopTimeout, state)
		}()
	}
	wg.Wait()
}

// Restart stops all workers, then starts them again on spec (nil = the
// current spec). It also clears the errored state.
func (s *Supervisor) Restart(spec *Spec) error {
	if !s.op.TryLock() {
		return ErrBusy
	}
	defer s.op.Unlock()
	if spec == nil {
		spec = s.Spec()
	}
	s.mu.Lock()
	s.state = AppStopping
	s.mu.Unlock()
	s.stopAll(Stopping)
	return s.startAll(spec)
}
