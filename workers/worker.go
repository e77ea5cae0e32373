package workers

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/logs"
)

// State of one worker process.
type State string

// Worker states, as status shows them.
const (
	Starting State = "starting"
	Ready    State = "ready"
	Draining State = "draining" // told to stop during a reload, finishing in-flight work
	Stopping State = "stopping" // told to stop (shutdown, scale down)
	Exited   State = "exited"
)

// tailLines is how many output lines of a worker are kept for status and errors.
const tailLines = 20

// Worker is one process of an app. Its fields after creation are read-only;
// mu guards the mutable ones.
type Worker struct {
	Slot       int
	PID        int
	Release    string
	Generation int
	Started    time.Time

	// spec is the spec it runs (its stop signal and timeout, listeners).
	spec *Spec

	proc *os.Process // nil for an adopted worker
	// reapMu orders the reap of our own worker (reap) with the signals to
	// its process group (signalGroup): the group's id is the worker's pid,
	// which is its own only until it is reaped. reaped is set under it
	// just before the reap.
	reapMu sync.Mutex
	reaped bool
	// pidfd watches and signals an adopted worker (started by the
	// previous agent: not our child); startTime (/proc/PID/stat field 22)
	// tells it from a process that reuses its pid.
	pidfd     *handoff.Pidfd
	startTime uint64
	// unit tracks every process the worker starts, daemons that left its
	// session included (sweep.go); nil for a worker adopted from an agent
	// that recorded none: its process group alone is killed.
	unit *procunit.Unit
	// kernel is what the kernel counted in its cgroups when it exited
	// (kernel.go); guarded by mu.
	kernel procunit.Stats
	// escaped are the processes of its unit that got its stop signal
	// (stopEscaped); guarded by mu.
	escaped []escapee
	// swept is made when the exit sweep begins and closed when it ended
	// (beginSweep, awaitSweep); nil before. Guarded by mu.
	swept chan struct{}
	// pz pauses the readers of the worker's channels for a handoff; ends
	// are the agent's ends that a handoff passes (out, err, ipc, node), and
	// notify its notify socket.
	pz   *pauser
	ends map[string]*os.File
	// kept names the fd numbers at which the process holds copies of
	// the agent's ends (handoff.Proc.Keep), for the agent that comes after
	// a crash (TakeBack); nil when it holds none. Set before serve.
	kept map[string]int
	// onReady is Options.OnReady; set before serve. steerReady, for a
	// steered pool, puts it in the steering map (steer.go) before its
	// state says ready.
	onReady    func(pid int)
	steerReady func(*Worker)
	notify     *handoff.NotifySocket
	tail       *logs.Tail
	ready      chan struct{} // closed when ready
	exited     chan struct{} // closed after Wait and after output is drained

	mu        sync.Mutex
	state     State
	readyAt   time.Time
	refused   string // why the agent refused a bind of the worker (bindtrap.Decision.Refused)
	status    string // sd_notify STATUS=
	watchdog  time.Time
	exitErr   error
	exitState *os.ProcessState
	exitedAt  time.Time
	readyOnce sync.Once
	health    healthState
	// saidStopping: the worker sent STOPPING=1 (it stopped accepting).
	saidStopping bool
	// stopSched is its processes' CPU figures when it got its stop signal
	// (askStop), and killedAtStop the stop_timeout at which awaitStop
	// killed it, 0 if it did not (stopkill.go).
	stopSched    schedTimes
	killedAtStop time.Duration
	// members are the agent's copies of the worker's own sockets (kernel
	// steering, steer.go) until it is put in its slot.
	members []member
	// sockets are the inodes of the worker's own listening sockets (kernel
	// steering), known from its start or found in its /proc/PID/fd; nil
	// until known. Owned by the loop (acceptq.go) once the worker is in
	// the pool.
	sockets []uint64
	// socketsLooked is when findSockets last looked for sockets in vain.
	socketsLooked time.Time

	// node is set for a worker with the Node.js preload (see node.go).
	node *nodeWorker
	// trap answers the worker's binds (Spec.BindTrap; bindtrap.go). Set
	// before serve.
	trap *workerTrap
}

// Ready is closed when the worker reported ready.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Done is closed when the process has exited and its output is drained.
func (w *Worker) Done() <-chan struct{} { return w.exited }

// State returns the current state.
func (w *Worker) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

func (w *Worker) setState(s State) {
	w.mu.Lock()
	if w.state != Exited {
		w.state = s
	}
	w.mu.Unlock()
}

// markReady records readiness once.
func (w *Worker) markReady() {
	w.readyOnce.Do(func() {
		// Recorded first: status reads the state, and an agent killed after
		// status showed a worker ready must leave it recorded ready.
		if w.onReady != nil {
			w.onReady(w.PID)
		}
		if w.steerReady != nil {
			w.steerReady(w)
		}
		w.mu.Lock()
		if w.state == Starting {
			w.state = Ready
		}
		w.readyAt = time.Now()
		w.mu.Unlock()
		close(w.ready)
	})
}

func (w *Worker) isReady() bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// ReadyAfter is the time from start to ready, 0 if not ready.
func (w *Worker) ReadyAfter() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readyAt.IsZero() {
		return 0
	}
	return w.readyAt.Sub(w.Started)
}

// lastWatchdog is when the worker last sent WATCHDOG=1 (or got ready).
func (w *Worker) lastWatchdog() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watchdog.IsZero() {
		return w.readyAt
	}
	return w.watchdog
}

// ExitDescription says how the worker ended ("exit status 1", "signal: killed").
func (w *Worker) ExitDescription() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exitState != nil {
		return w.exitState.String() + w.kernelNote()
	}
	if w.exitErr != nil {
		return w.exitErr.Error()
	}
	return ""
}

// stopDescription is ExitDescription with the worker's last sd_notify
// STATUS, for the exit of a worker the supervisor stopped: what it said it
// was doing when it went (a preload's "draining", an app's own words).
func (w *Worker) stopDescription() string {
	d := w.ExitDescription()
	w.mu.Lock()
	last, killed := w.status, w.killedAtStop
	var byKill bool
	if w.exitState != nil {
		ws, ok := w.exitState.Sys().(syscall.WaitStatus)
		byKill = ok && ws.Signal() == syscall.SIGKILL
	}
	w.mu.Unlock()
	if killed > 0 && byKill { // not one that exited on its own as the timer fired
		d = fmt.Sprintf("%s at stop_timeout (%s)", d, killed)
	}
	if last == "" {
		return d
	}
	return fmt.Sprintf("%s; last status %q", d, last)
}

// LastLines returns the last lines of the worker's output.
func (w *Worker) LastLines() []string { return w.tail.Lines() }

// stoppedAccepting reports whether the worker said it stopped (STOPPING=1).
func (w *Worker) stoppedAccepting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.saidStopping
}

// stop asks the worker to stop with its spec's stop signal and waits up to
// its stop timeout; then the process group is killed (and log says why).
// Returns when the worker is gone. Safe to call more than once and
// concurrently.
func (w *Worker) stop(state State, log hclog.Logger) {
	select {
	case <-w.exited:
		return
	default:
	}
	w.awaitStop(w.askStop(state), log)
}

// askStop moves the worker to state and sends it its stop signal; it
// returns when the worker is to be killed, stop_timeout from now. An
// exited process is not an error: awaitStop returns at once.
func (w *Worker) askStop(state State) time.Time {
	w.setState(state)
	w.signal(w.spec.StopSignal)
	w.stopEscaped(w.spec.StopSignal)
	killAt := time.Now().Add(w.spec.StopTimeout)
	sched := treeSched(w.PID) // after the signal: it waits for no diagnostics
	w.mu.Lock()
	w.stopSched = sched
	w.mu.Unlock()
	return killAt
}

// awaitStop waits until the worker is gone, killing its process group at
// killAt if it still runs then; log says why, with what the worker's
// processes did since the stop signal (logStopKill).
func (w *Worker) awaitStop(killAt time.Time, log hclog.Logger) {
	t := time.NewTimer(time.Until(killAt))
	defer t.Stop()
	select {
	case <-w.exited:
	case <-t.C:
		w.mu.Lock()
		before := w.stopSched
		w.mu.Unlock()
		w.logStopKill(log, before)
		w.killGroup()
		w.mu.Lock()
		w.killedAtStop = w.spec.StopTimeout
		w.mu.Unlock()
		<-w.exited
	}
}

// finish marks the worker exited once nothing of it is left.
func (w *Worker) finish() {
	closeMembers(w.takeMembers())
	w.mu.Lock()
	w.state = Exited
	w.mu.Unlock()
	close(w.exited)
}

func (w *Worker) capture(wg *sync.WaitGroup, stream string, r *os.File, j *logs.Journal, sink *logs.Sink, app string, ready ReadyPolicy) {
	defer wg.Done()
	matchReady := ready.Mode == ReadyLog && ready.Regex != nil
	seen := func(text string) {
		w.tail.Add(text)
		if matchReady && ready.Regex.MatchString(text) {
			w.markReady()
		}
	}
	line := func(text string) logs.Line {
		return logs.Line{Time: time.Now(), App: app, Slot: w.Slot, PID: w.PID, Stream: stream, Text: text, Release: w.Release}
	}
	w.pz.run(stream, func(pending []byte) ([]byte, error) {
		if j != nil {
			return nil, logs.CaptureJournaled(r, j, pending, sink, 0, line, seen)
		}
		return logs.CaptureFrom(r, pending, 0, func(text string) {
			seen(text)
			if sink != nil {
				sink.Write(line(text))
			}
		})
	})
}

// maxIPCMessage bounds one node-ipc message; a longer one is read in parts
// (and so never taken for "ready").
const maxIPCMessage = 1 << 20

// readIPC reads node-ipc messages (JSON lines) and treats "ready" as ready,
// as PM2's wait_ready does.
func (w *Worker) readIPC(wg *sync.WaitGroup, f *os.File) {
	defer wg.Done()
	w.pz.run("ipc", func(pending []byte) ([]byte, error) {
		return logs.CaptureFrom(f, pending, maxIPCMessage, func(msg string) {
			if msg == `"ready"` {
				w.markReady()
			}
		})
	})
}

func (w *Worker) readyAfterDelay(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		w.markReady()
	case <-w.exited:
	}
}

// onNotify handles an sd_notify message sent by the worker or its children.
func (w *Worker) onNotify(msg handoff.Notify) {
	if v, ok := msg["STATUS"]; ok {
		w.mu.Lock()
		w.status = v
		w.mu.Unlock()
	}
	if msg["WATCHDOG"] == "1" {
		w.mu.Lock()
		w.watchdog = time.Now()
		w.mu.Unlock()
	}
	if msg["STOPPING"] == "1" {
		w.mu.Lock()
		w.saidStopping = true
		if w.state != Exited && w.state != Draining { // a drain shows as one to its end
			w.state = Stopping
		}
		w.mu.Unlock()
	}
	if msg["READY"] == "1" {
		w.markReady()
	}
}

// waitReady waits until w is ready, exits, or timeout passes.
func waitReady(w *Worker, timeout time.Duration, cancel <-chan struct{}) error {
	isReady := func() bool {
		select {
		case <-w.ready:
			return true
		default:
			return false
		}
	}
	if isReady() {
		return nil
	}
	t := time.NewTimer(max(timeout, 0))
	defer t.Stop()
	select {
	case <-w.ready:
		return nil
	case <-w.exited:
		// Ready, then exited: not to be trusted either.
		return &NotReadyError{Worker: w, Exited: true, AfterReady: isReady()}
	case <-t.C:
		if isReady() {
			return nil
		}
		return &NotReadyError{Worker: w, Timeout: timeout}
	case <-cancel:
		return ErrCanceled
	}
}

// stayUp waits until w has been up for d after it got ready. A worker that
// exits first (with any status) gives a *NotReadyError with AfterReady.
func stayUp(w *Worker, d time.Duration, cancel <-chan struct{}) error {
	select {
	case <-w.exited:
		return &NotReadyError{Worker: w, Exited: true, AfterReady: true}
	default:
	}
	w.mu.Lock()
	left := time.Until(w.readyAt.Add(d))
	w.mu.Unlock()
	if left <= 0 {
		return nil
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-w.exited:
		return &NotReadyError{Worker: w, Exited: true, AfterReady: true}
	case <-cancel:
		return ErrCanceled
	}
}

// exitedEarly returns a *NotReadyError for the first worker of ws that
// has exited, nil when all still run.
func exitedEarly(ws []*Worker) error {
	for _, w := range ws {
		select {
		case <-w.exited:
			return &NotReadyError{Worker: w, Exited: true, AfterReady: true}
		default:
		}
	}
	return nil
}

// upAfterReady is how long the worker ran after it got ready (0 if it
// never did); until now while it runs.
func (w *Worker) upAfterReady() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readyAt.IsZero() {
		return 0
	}
	if w.exitState != nil || w.exitErr != nil {
		return w.exitedAt.Sub(w.readyAt)
	}
	return time.Since(w.readyAt)
}

// cpuFor is the usable CPU for slot: slot mod the CPUs the agent may use.
func cpuFor(slot int) int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return -1
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return -1
	}
	return cpus[slot%len(cpus)]
}
