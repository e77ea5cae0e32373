package workers

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
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

	proc   *os.Process
	tail   *logs.Tail
	ready  chan struct{} // closed when ready
	exited chan struct{} // closed after Wait and after output is drained

	mu        sync.Mutex
	state     State
	readyAt   time.Time
	status    string // sd_notify STATUS=
	watchdog  time.Time
	exitErr   error
	exitState *os.ProcessState
	readyOnce sync.Once
	cpu       cpuSample

	// node is set for a worker with the Node.js preload (see node.go).
	node *nodeWorker
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
		w.mu.Lock()
		if w.state == Starting {
			w.state = Ready
		}
		w.readyAt = time.Now()
		w.mu.Unlock()
		close(w.ready)
	})
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

// ExitDescription says how the worker ended ("exit status 1", "signal: killed").
func (w *Worker) ExitDescription() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exitState != nil {
		return w.exitState.String()
	}
	if w.exitErr != nil {
		return w.exitErr.Error()
	}
	return ""
}

// ExitCode is the exit code, or -1 when killed by a signal or still running.
func (w *Worker) ExitCode() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exitState == nil {
		return -1
	}
	return w.exitState.ExitCode()
}

// LastLines returns the last lines of the worker's output.
func (w *Worker) LastLines() []string { return w.tail.Lines() }

// Signal sends sig to the worker's main process.
func (w *Worker) Signal(sig syscall.Signal) error {
	err := w.proc.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// killGroup sends SIGKILL to the worker's whole process group.
func (w *Worker) killGroup() {
	_ = syscall.Kill(-w.PID, syscall.SIGKILL)
}

// Stop asks the worker to stop with sig and waits up to timeout; then the
// process group is killed. Returns when the worker is gone. Safe to call
// more than once and concurrently.
func (w *Worker) Stop(sig syscall.Signal, timeout time.Duration, state State) {
	select {
	case <-w.exited:
		return
	default:
	}
	w.setState(state)
	if w.node != nil {
		w.node.signal(w.PID, sig)
	} else {
		_ = w.Signal(sig)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.exited:
	case <-t.C:
		w.killGroup()
		<-w.exited
	}
}

// spawnArgs is what spawn needs besides the spec.
type spawnArgs struct {
	shim     string
	out, err *logs.Sink
	app      string
}

// spawn starts a worker for slot with spec. The worker's own goroutines
// (output readers, readiness, waiter) end when the process has exited.
func spawn(a spawnArgs, spec *Spec, slot int) (*Worker, error) {
	notify, err := handoff.ListenNotify()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		notify.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		notify.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	env := append([]string{}, spec.Env...)
	env = append(env,
		"DEPLOYD_APP="+a.app,
		"DEPLOYD_WORKER="+strconv.Itoa(slot),
		"DEPLOYD_RELEASE="+spec.Release,
		handoff.EnvNotifySocket+"="+notify.Addr(),
	)
	if spec.Watchdog > 0 {
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(spec.Watchdog.Microseconds(), 10))
	}
	cpu := -1
	if spec.CPUAffinity {
		cpu = cpuFor(slot)
	}
	var ipc *handoff.IPCChannel
	var extra []*os.File
	if spec.Ready.Mode == config.ReadyNodeIPC {
		if ipc, err = handoff.NewIPCChannel(); err != nil {
			notify.Close()
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, err
		}
		extra = append(extra, ipc.Child)
		env = append(env,
			handoff.EnvNodeChannelFD+"="+strconv.Itoa(3+len(spec.Listeners)),
			"NODE_CHANNEL_SERIALIZATION_MODE=json")
	}
	var node *nodeStart
	var fixed []handoff.FixedFile
	if spec.Node != nil {
		node, err = prepareNode(spec, env)
		if err != nil {
			closeFiles(outR, outW, errR, errW)
			if ipc != nil {
				closeFiles(ipc.Parent, ipc.Child)
			}
			notify.Close()
			return nil, err
		}
		env, fixed = node.env, node.fixed
	}
	proc, err := handoff.Start(handoff.Proc{
		Shim: a.shim, Argv: spec.Argv, Dir: spec.Dir, Env: env,
		Stdout: outW, Stderr: errW, Listeners: spec.Listeners, Extra: extra, Fixed: fixed,
		Credential: spec.Credential, Pin: cpu >= 0, CPU: cpu,
	})
	outW.Close()
	errW.Close()
	if ipc != nil {
		ipc.Child.Close()
	}
	if node != nil {
		node.ch.Child.Close()
	}
	if err != nil {
		notify.Close()
		outR.Close()
		errR.Close()
		if ipc != nil {
			ipc.Parent.Close()
		}
		if node != nil {
			node.ch.Parent.Close()
		}
		return nil, err
	}
	w := &Worker{
		Slot: slot, PID: proc.Pid, Release: spec.Release, Generation: spec.Generation,
		Started: time.Now(), proc: proc, tail: logs.NewTail(tailLines),
		ready: make(chan struct{}), exited: make(chan struct{}), state: Starting,
	}
	uid := os.Getuid()
	if spec.Credential != nil {
		uid = int(spec.Credential.Uid)
	}
	var notifyDone sync.WaitGroup
	notifyDone.Add(1)
	go func() {
		defer notifyDone.Done()
		_ = notify.Serve(func(_, from int, msg handoff.Notify) {
			// Only the worker's user (or root) may speak for it: the
			// abstract socket's name is visible to every local user.
			if from == uid || from == 0 {
				w.onNotify(msg)
			}
		})
	}()
	var readers sync.WaitGroup
	readers.Add(2)
	go w.capture(&readers, outR, a.out, "out", a.app, spec.Ready)
	go w.capture(&readers, errR, a.err, "err", a.app, spec.Ready)
	if ipc != nil {
		readers.Add(1)
		go w.readIPC(&readers, ipc.Parent)
	}
	if node != nil {
		w.node = &nodeWorker{done: make(chan struct{}), grace: spec.StopTimeout, indirect: spec.Node.Indirect}
		readers.Add(1)
		go w.readNode(&readers, node.ch.Parent, spec.Ready)
	}
	if spec.Ready.Mode == config.ReadyDelay {
		go w.readyAfterDelay(spec.Ready.Delay)
	}
	pipes := []*os.File{outR, errR}
	if ipc != nil {
		pipes = append(pipes, ipc.Parent)
	}
	if node != nil {
		pipes = append(pipes, node.ch.Parent)
	}
	go func() {
		w.wait(&readers, pipes)
		notify.Close()
		notifyDone.Wait()
		w.finish()
	}()
	return w, nil
}

// outputGrace bounds the wait for a worker's output after it exited: a
// descendant that left the process group (setsid, nohup) may hold the pipes
// open for ever (as os/exec's Cmd.WaitDelay).
const outputGrace = 2 * time.Second

// wait reaps the process and drains its output.
func (w *Worker) wait(readers *sync.WaitGroup, pipes []*os.File) {
	st, err := w.proc.Wait()
	if w.node != nil {
		w.node.await() // npm start: the app's node may outlive npm
	}
	// Output pipes may be held open by children the worker left behind;
	// they die with the group, so the readers see EOF.
	w.killGroup()
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	t := time.NewTimer(outputGrace)
	select {
	case <-drained:
	case <-t.C:
		// Closing the read ends ends the readers' blocked reads.
		for _, p := range pipes {
			p.Close()
		}
		<-drained
	}
	t.Stop()
	w.mu.Lock()
	w.exitState, w.exitErr = st, err
	w.mu.Unlock()
}

// finish marks the worker exited once nothing of it is left.
func (w *Worker) finish() {
	w.mu.Lock()
	w.state = Exited
	w.mu.Unlock()
	close(w.exited)
}

func (w *Worker) capture(wg *sync.WaitGroup, r *os.File, sink *logs.Sink, stream, app string, ready config.Ready) {
	defer wg.Done()
	defer r.Close()
	matchReady := ready.Mode == config.ReadyLog && ready.Regex != nil
	_ = logs.Capture(r, 0, func(text string) {
		w.tail.Add(text)
		if sink != nil {
			sink.Write(logs.Line{Time: time.Now(), App: app, Slot: w.Slot, PID: w.PID, Stream: stream, Text: text})
		}
		if matchReady && ready.Regex.MatchString(text) {
			w.markReady()
		}
	})
}

// readIPC reads node-ipc messages (JSON lines) and treats "ready" as ready,
// as PM2's wait_ready does.
func (w *Worker) readIPC(wg *sync.WaitGroup, f *os.File) {
	defer wg.Done()
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		if string(sc.Bytes()) == `"ready"` {
			w.markReady()
		}
	}
	// A message over the limit stops the scanner: keep reading, so the
	// app's next process.send does not fail.
	_, _ = io.Copy(io.Discard, f)
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
		w.setState(Stopping)
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
		if isReady() {
			return nil // ready, then exited: the caller's watch restarts it
		}
		return &NotReadyError{Worker: w, Exited: true}
	case <-t.C:
		if isReady() {
			return nil
		}
		return &NotReadyError{Worker: w, Timeout: timeout}
	case <-cancel:
		return ErrCanceled
	}
}

// ErrCanceled is returned when an operation was stopped by a shutdown.
var ErrCanceled = errors.New("workers: canceled by shutdown")

// NotReadyError tells why a worker never got ready.
type NotReadyError struct {
	Worker  *Worker
	Exited  bool
	Timeout time.Duration
}

func (e *NotReadyError) Error() string {
	w := e.Worker
	if e.Exited {
		return fmt.Sprintf("worker %d (pid %d) exited before it was ready: %s", w.Slot, w.PID, w.ExitDescription())
	}
	return fmt.Sprintf("worker %d (pid %d) was not ready within ready_timeout %s", w.Slot, w.PID, e.Timeout)
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
