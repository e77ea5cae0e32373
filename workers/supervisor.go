// Package workers runs an app's pool of worker processes: it spawns them
// with the app's listeners, waits for readiness, restarts crashed workers with
// backoff, replaces them in a rolling or blue-green reload, captures their
// output and samples per-process stats. Each app's Supervisor is one
// goroutine that owns the pool's slots, workers, state and counters, and
// publishes every change as an Event. It owns its policy types (Ready,
// RestartPolicy) and knows nothing of the agent's config or the control
// protocol.
//
// This is the agent's side of a pool. The package worker (singular) is the
// app's side: what a Go app imports to serve the listeners it is given.
package workers

import (
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/handoff/bindtrap"
	"github.com/deployd/deployd/internal/procstat"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/jsdrain"
	"github.com/deployd/deployd/workers/logs"
	"github.com/deployd/deployd/workers/nodejs"
)

// Spec is what a generation of workers runs. A Spec is not changed after it
// is passed to a Supervisor.
type Spec struct {
	Release    string
	Generation int
	Argv       []string
	Dir        string
	Env        []string
	Credential *syscall.Credential
	// Listeners become the workers' fds 3, 4, ..., named as the spec's
	// config names them (the listener itself is shared and never changes).
	Listeners []handoff.Bound

	// Instances counts the slots, Spares among them: with kernel steering
	// (balance even or sticky), Spares workers are started and kept ready
	// but get no connection until one takes the place of a worker that
	// is not ready (steer.go).
	Instances    int
	Spares       int
	Ready        ReadyPolicy
	ReadyTimeout time.Duration
	// MinReady is how long a new worker of an operation must stay up after
	// ready before the worker it replaces is stopped (a bake time).
	MinReady    time.Duration
	StopSignal  syscall.Signal
	StopTimeout time.Duration
	// QuietTimeout bounds the quiet phase before the stop signal of a
	// worker with sockets of its own (quiet.go); 0 turns it off.
	QuietTimeout time.Duration
	Restart      RestartPolicy
	MaxSurge     int
	// MaxMemory (bytes) and Watchdog, when > 0, make the supervisor replace
	// a worker over the limit or silent for longer, the graceful way.
	MaxMemory int64
	Watchdog  time.Duration
	// Limits are each worker's cgroup limits, set before it starts.
	Limits procunit.Limits
	// RecycleAfter, when > 0, makes the supervisor replace each worker
	// the same way once it has run that long plus its jitter (recycleDue).
	RecycleAfter time.Duration
	// RecycleAt, when set, makes the supervisor replace, the same way,
	// each worker that a time of the schedule has passed since it started
	// (recycle_at); RecycleAtText is the schedule as configured.
	RecycleAt     Schedule
	RecycleAtText string
	// Health, when set, is the liveness check (health.go).
	Health *HealthPolicy
	// CPUAffinity pins worker slot i to usable CPU i mod n.
	CPUAffinity bool
	// Node, when set, starts the workers with deployd's Node.js preload.
	Node *nodejs.Spec
	// JS, when set, starts Bun or Deno workers with their drain preload.
	JS *jsdrain.Spec
	// BindTrap: a worker's own bind of a listener's address is answered
	// with the agent's socket (bindtrap.go, handoff/bindtrap).
	BindTrap bool
	// BindPolicy, when set, decides a worker's binds instead of
	// bindtrap.Match (a TCP bind of a listen's port takes its socket,
	// every other bind runs as asked): the agent's address trust policy.
	// It gets the sockets of the worker's listens.
	BindPolicy func([]bindtrap.Listen) bindtrap.Decide
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
	// AppCanary: a canary is held, old and new releases serve side by side
	// until Promote or Abort (canary.go).
	AppCanary AppState = "canary"
)

// Options are the fixed parts of a supervisor.
type Options struct {
	App      string
	Shim     string // the deployd binary (LISTEN_PID shim)
	Out, Err *logs.Sink
	Logger   hclog.Logger
	// Changed, when set, is called (from the supervisor's loop: it must not
	// block) whenever a worker process starts, gets ready or ends: the
	// agent then rewrites its record of the processes it runs (a worker
	// recorded ready is adopted ready after an agent crash).
	Changed func()
	// NotifyDir is the folder of the workers' NOTIFY_SOCKET paths, one
	// private folder per worker inside; "" gives abstract sockets.
	NotifyDir string
	// BeforeStart, when set, is called before each worker process starts
	// (from the loop too: it must not call the supervisor); an error
	// refuses the start (ErrNotRecorded). Marker, when set, is every
	// worker's DEPLOYD_AGENT_ID. See spawn.go.
	BeforeStart func(slot int) error
	Marker      string
	// OnReady, when set, is called once a worker process is ready, before
	// anyone can see it ready (from the goroutine that read its readiness:
	// it must not call the supervisor): the agent records it, so that an
	// agent killed right after adopts it ready (its READY=1 was read).
	OnReady func(pid int)
}

// Supervisor keeps one app's workers running. Its state is owned by one
// goroutine (run, loop.go); every method is safe to call concurrently.
// Operations that replace workers (Start, Reload, Restart, Scale, Pause)
// run one at a time: another one asked meanwhile gets a *BusyError.
type Supervisor struct {
	opts Options
	log  hclog.Logger
	fs   procstat.FS

	reqs   chan request
	quit   chan struct{} // closed by Stop to end the loop
	done   chan struct{} // closed when the loop has ended
	cancel chan struct{} // closed by Stop: running waits give up
	st     state         // owned by run

	stopOnce sync.Once
	wg       sync.WaitGroup // watch goroutines and monitor operations
	// healthFailed counts the failed liveness checks of every worker the
	// app had (added to by their health goroutines).
	healthFailed atomic.Uint64
}

// New returns a supervisor with no workers; call Start. Call Stop to end
// it (its loop runs until then).
func New(opts Options, spec *Spec) *Supervisor {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	s := &Supervisor{
		opts: opts, log: opts.Logger.Named(opts.App),
		reqs: make(chan request), quit: make(chan struct{}), done: make(chan struct{}),
		cancel: make(chan struct{}),
		st: state{spec: spec, app: AppStopped, usage: map[*Worker]sample{},
			subs: map[*subscriber]struct{}{}},
	}
	go s.run()
	return s
}

// Spec returns the spec the app is (being) moved to.
func (s *Supervisor) Spec() *Spec {
	var spec *Spec
	s.read(func(st *state) { spec = st.spec })
	return spec
}

func (s *Supervisor) args() spawnArgs {
	return spawnArgs{
		shim: s.opts.Shim, out: s.opts.Out, err: s.opts.Err, app: s.opts.App,
		notifyDir: s.opts.NotifyDir, log: s.log, healthFailed: &s.healthFailed,
		beforeStart: s.opts.BeforeStart, marker: s.opts.Marker, onReady: s.opts.OnReady, steerReady: s.steerReady,
	}
}

// Start starts spec.Instances workers and waits until all are ready or
// ready_timeout passes. Workers that fail are restarted by the crash policy;
// the error says which were not ready.
func (s *Supervisor) Start() error {
	o, err := s.begin("start", nil)
	if err != nil {
		return err
	}
	defer o.end()
	return o.startAll(s.Spec())
}

// Restart stops all workers, then starts them again on spec (nil = the
// current spec). It also clears the errored state.
func (s *Supervisor) Restart(spec *Spec) error {
	o, err := s.begin("restart", nil)
	if err != nil {
		return err
	}
	defer o.end()
	if spec == nil {
		spec = s.Spec()
	}
	o.change(func(st *state) { s.setApp(st, AppStopping, nil) })
	o.stopAll(Stopping)
	return o.startAll(spec)
}

// Pause stops every worker (stop signal, then SIGKILL after stop_timeout)
// and leaves the app stopped until Start or Scale.
func (s *Supervisor) Pause() error {
	o, err := s.begin("pause", nil)
	if err != nil {
		return err
	}
	defer o.end()
	o.change(func(st *state) { s.setApp(st, AppStopping, nil) })
	o.stopAll(Stopping)
	o.change(func(st *state) { s.setApp(st, AppStopped, func() { st.slots = nil }) })
	return nil
}

// Stop stops every worker (stop signal, then SIGKILL of its group after
// stop_timeout), cancels a running operation and waits for it, and returns
// when all are gone and the loop has ended. Safe to call twice, and
// concurrently: every call returns when the first is done.
func (s *Supervisor) Stop() { s.stopOnce.Do(s.stop) }

func (s *Supervisor) stop() {
	s.Resume()            // a handoff in flight is over: this agent stops
	s.ResumeConnections() // held connections go to the workers while they last
	var running *opInfo
	s.call(func(st *state) {
		st.closing = true
		close(s.cancel)
		if st.hold != nil {
			st.hold.stopTimer()
		}
		running = st.op
		s.setApp(st, AppStopping, nil)
	})
	if running != nil {
		<-running.done // it sees cancel and ends
	}
	o := s.newOp("stop", "", nil)
	o.stopAll(Stopping)
	o.change(func(st *state) {
		s.setApp(st, AppStopped, nil)
		st.closeSubs()
	})
	close(s.quit)
	<-s.done
	s.wg.Wait()
}

// startAll moves the pool to fresh slots of spec and starts a worker in
// each, then waits until all are ready or ready_timeout passes.
func (o *op) startAll(spec *Spec) error { return o.startAdopting(spec, nil, nil, nil) }

// waitAllReady waits for every worker of ws, publishing each ready one.
func (o *op) waitAllReady(ws []*Worker, spec *Spec) []error {
	var errs []error
	deadline := time.Now().Add(spec.ReadyTimeout)
	for _, w := range ws {
		if err := o.s.waitReady(w, time.Until(deadline), spec); err != nil {
			errs = append(errs, err)
			continue
		}
		o.publish(Event{Type: EventReady, Slot: w.Slot, PID: w.PID, Release: w.Release,
			Millis: w.ReadyAfter().Milliseconds()}, func(st *state) { st.resample(o.s.fs, w) })
	}
	return errs
}

// waitReady is waitReady with the supervisor's cancel and the spec's
// timeout named in the error.
func (s *Supervisor) waitReady(w *Worker, timeout time.Duration, spec *Spec) error {
	err := waitReady(w, timeout, s.cancel)
	if nr, ok := err.(*NotReadyError); ok && !nr.Exited {
		nr.Timeout = spec.ReadyTimeout
	}
	return err
}

// stopAll stops every worker in parallel, and waits for the background
// drains (each bounded by its own stop_timeout; never signalled again).
func (o *op) stopAll(how State) {
	type victim struct {
		sl *slot
		w  *Worker
	}
	var vs []victim
	var drains []*drain
	o.change(func(st *state) {
		drains = slices.Clone(st.draining)
		for _, sl := range st.slots {
			if sl.timer != nil { // a crash restart due: none while stopping
				sl.timer.Stop()
				sl.timer = nil
			}
			for _, w := range append([]*Worker{sl.cur}, sl.extra...) {
				if w != nil && !st.handedOver[w] {
					vs = append(vs, victim{sl, w})
				}
			}
		}
	})
	var wg sync.WaitGroup
	for _, v := range vs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.stopWorker(v.sl, v.w, how, false)
		}()
	}
	wg.Wait()
	for _, d := range drains {
		<-d.done
	}
}
