package workers

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/logs"
)

// spawnArgs is what spawn needs besides the spec.
type spawnArgs struct {
	shim     string
	out, err *logs.Sink
	app      string
	// notifyDir holds the workers' NOTIFY_SOCKET paths ("" = abstract).
	notifyDir string
	log       hclog.Logger
	// healthFailed counts the app's failed liveness checks.
	healthFailed *atomic.Uint64
	// beforeStart records that a worker of slot is about to start; marker
	// is its DEPLOYD_AGENT_ID (Options).
	beforeStart func(slot int) error
	marker      string
	onReady     func(pid int)
	steerReady  func(*Worker)
}

// EnvAgentID names the worker's marker: the agent that started it
// (Options.Marker). It comes first in the worker's environment, so that a
// scan of /proc/PID/environ finds it in a bounded read.
const EnvAgentID = "DEPLOYD_AGENT_ID"

// ErrNotRecorded refuses a worker start the agent could not record first
// (Options.BeforeStart): a worker no record names would run on unsupervised
// if the agent died.
var ErrNotRecorded = errors.New("workers: not started: the agent could not record it first")

// channels are the agent's ends of what connects it to one worker process.
// The child ends are closed once the process has started.
type channels struct {
	notify                 *handoff.NotifySocket
	outR, outW, errR, errW *os.File
	// outJ and errJ hold the output between the pipes and the log files
	// (logs.Journal); nil where memfd_create failed: lines are then read
	// into memory, and an agent SIGKILL may lose the last ones.
	outJ, errJ *logs.Journal
	ipc        *handoff.IPCChannel // node-ipc readiness only
	node       *nodeStart          // the Node.js preload's channel and fds
	// health is the child's end of the worker's private health listener
	// (nil without health checks); healthAddr the agent probes.
	health     *os.File
	healthAddr string
	// notifyCopy is the copy of the notify socket the worker keeps (keep);
	// closed once the worker started.
	notifyCopy *os.File
}

// keep lists the agent's ends the worker holds for the agent that comes
// after a crash (handoff.KeepFD), and their fd numbers in the worker, in
// the order of Handover streams. An end it cannot copy is not kept: that
// worker is then retired, not adopted, after a crash.
func (c *channels) keep() ([]*os.File, map[string]int) {
	var fs []*os.File
	kept := map[string]int{}
	add := func(name string, f *os.File) {
		kept[name] = handoff.KeepFD + len(fs)
		fs = append(fs, f)
	}
	if f, err := c.notify.File(); err == nil {
		c.notifyCopy = f
		add("notify", f)
	}
	add("out", c.outR)
	add("err", c.errR)
	if c.outJ != nil && c.errJ != nil {
		add("outj", c.outJ.File())
		add("errj", c.errJ.File())
	}
	if c.ipc != nil {
		add("ipc", c.ipc.Parent)
	}
	if c.node != nil {
		add(nodeStream, c.node.ch.Parent)
	}
	return fs, kept
}

// openChannels opens the notify socket, the output pipes and, for
// node-ipc readiness, the IPC channel. On error nothing stays open.
func openChannels(a spawnArgs, spec *Spec) (*channels, error) {
	c := &channels{}
	uid := -1
	if spec.Credential != nil {
		uid = int(spec.Credential.Uid)
	}
	var err error
	if c.notify, err = handoff.ListenNotify(a.notifyDir, uid); err != nil {
		return nil, err
	}
	if ferr := c.notify.Fallback(); ferr != nil && a.notifyDir != "" && a.log != nil {
		a.log.Warn("NOTIFY_SOCKET is an abstract socket (sd_notify clients that only take paths, such as Puma's, will fail)",
			"reason", ferr)
	}
	if c.outR, c.outW, err = os.Pipe(); err == nil {
		c.errR, c.errW, err = os.Pipe()
	}
	if err == nil {
		// What the worker can write while no agent reads (after a crash);
		// the default size where the system allows less.
		_, _ = handoff.EnlargePipe(c.outW)
		_, _ = handoff.EnlargePipe(c.errW)
	}
	if err == nil {
		c.openJournals(a)
	}
	if err == nil && spec.Ready.Mode == ReadyNodeIPC {
		c.ipc, err = handoff.NewIPCChannel()
	}
	if err == nil && spec.wantsHealthSocket() {
		c.healthAddr = handoff.HealthAddr(c.notify.Addr())
		c.health, err = handoff.ListenHealth(c.healthAddr, uid)
	}
	if err != nil {
		c.closeChild()
		c.closeParent()
		return nil, err
	}
	return c, nil
}

// closeChild closes the ends the worker got.
func (c *channels) closeChild() {
	for _, f := range []*os.File{c.outW, c.errW, c.health} {
		if f != nil {
			f.Close()
		}
	}
	if c.ipc != nil {
		c.ipc.Child.Close()
	}
	if c.node != nil {
		c.node.ch.Child.Close()
	}
}

// closeParent closes the agent's ends (after a failed start).
func (c *channels) closeParent() {
	c.notify.Close()
	for _, f := range []*os.File{c.outR, c.errR} {
		if f != nil {
			f.Close()
		}
	}
	c.closeJournals()
	if c.ipc != nil {
		c.ipc.Parent.Close()
	}
	if c.node != nil {
		c.node.ch.Parent.Close()
	}
}

// workerEnv is the worker's environment: the spec's, then its identity,
// the notify socket, the watchdog and the node-ipc channel.
func workerEnv(a spawnArgs, spec *Spec, slot int, c *channels) []string {
	env := make([]string, 0, len(spec.Env)+8)
	if a.marker != "" {
		env = append(env, EnvAgentID+"="+a.marker)
	}
	env = append(env, spec.Env...)
	env = append(env,
		"DEPLOYD_APP="+a.app,
		"DEPLOYD_WORKER="+strconv.Itoa(slot),
		"DEPLOYD_RELEASE="+spec.Release,
		handoff.EnvNotifySocket+"="+c.notify.Addr(),
	)
	if spec.Watchdog > 0 {
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(spec.Watchdog.Microseconds(), 10))
	}
	if c.ipc != nil {
		fd := 3 + len(spec.Listeners)
		if c.health != nil {
			fd++ // the health listener comes first
		}
		env = append(env,
			handoff.EnvNodeChannelFD+"="+strconv.Itoa(fd),
			"NODE_CHANNEL_SERIALIZATION_MODE=json")
	}
	return env
}

// spawn starts a worker for slot with spec. The worker's own goroutines
// (output readers, readiness, waiter) end when the process has exited.
func spawn(a spawnArgs, spec *Spec, slot int) (*Worker, error) {
	if a.beforeStart != nil {
		if err := a.beforeStart(slot); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotRecorded, err)
		}
	}
	if spec.JS != nil { // Bun and Deno: their drain preload (jsdrain)
		if err := spec.JS.Verify(); err != nil {
			return nil, err
		}
	}
	ls, members, err := workerListeners(spec)
	if err != nil {
		return nil, err
	}
	c, err := openChannels(a, spec)
	if err != nil {
		closeMembers(members)
		return nil, err
	}
	cpu := -1
	if spec.CPUAffinity {
		cpu = cpuFor(slot)
	}
	var extra []*os.File
	if c.ipc != nil {
		extra = append(extra, c.ipc.Child)
	}
	unit := procunit.New("worker-" + a.app + "-" + strconv.Itoa(slot))
	for _, un := range unit.Limit(spec.Limits) {
		if a.log != nil {
			a.log.Warn("a limit cannot apply to the worker", "worker", slot, "key", un.Key, "why", un.Why)
		}
	}
	env := workerEnv(a, spec, slot, c)
	env = append(env, unit.Env())
	argv := spec.Argv
	if spec.JS != nil { // Bun's and Deno's drain preload (jsdrain)
		argv, env = spec.JS.Apply(argv, env)
	}
	src := sourceOf(spec)
	st := &sourceStart{spec: spec, ls: ls, c: c, cpu: cpu, env: env}
	if err := src.prepare(st); err != nil {
		unit.DropCgroup() // made for a start that does not happen
		unit.DropV1()
		c.closeChild()
		c.closeParent()
		closeMembers(members)
		return nil, err
	}
	keep, kept := c.keep()
	hp := handoff.Proc{
		Shim: a.shim, Argv: argv, Dir: spec.Dir,
		Stdout: c.outW, Stderr: c.errW, Listeners: ls, Health: c.health, Extra: extra,
		Keep: keep, Credential: spec.Credential, Pin: cpu >= 0, CPU: cpu,
	}
	st.apply(&hp, kept)
	hp.Cgroup, hp.UseCgroup = unit.CgroupFD()
	proc, err := handoff.Start(hp)
	if err != nil && hp.UseCgroup {
		// A kernel without clone3's CLONE_INTO_CGROUP: the sweep tracks it.
		unit.DropCgroup()
		hp.UseCgroup = false
		proc, err = handoff.Start(hp)
	}
	c.closeChild()
	if f := c.notifyCopy; f != nil {
		f.Close()
	}
	st.closeChild()
	if err != nil {
		st.closeAgent()
		unit.DropCgroup()
		unit.DropV1()
		c.closeParent()
		closeMembers(members)
		return nil, err
	}
	unit.Started(proc.Pid)
	if err := unit.Join(proc.Pid); err != nil && a.log != nil {
		a.log.Warn("the worker could not join its cgroup v1 limits", "worker", slot, "pid", proc.Pid, "error", err)
	}
	// The shim execs the app in the same process: its start time stays.
	// (A Direct start has no shim: node is the process from the start.)
	start, _ := handoff.StartTime(proc.Pid)
	w := &Worker{
		Slot: slot, PID: proc.Pid, Release: spec.Release, Generation: spec.Generation,
		Started: time.Now(), spec: spec, proc: proc, startTime: start, tail: logs.NewTail(tailLines),
		ready: make(chan struct{}), exited: make(chan struct{}), state: Starting, kept: kept,
		members: members, sockets: memberInodes(members), unit: unit,
	}
	src.started(w, a.log, st)
	w.serve(a, spec, c, nil)
	return w, nil
}

// serve starts the worker's goroutines: notify messages, output capture,
// node-ipc, delay readiness, and the waiter that ends them all. pending
// holds the partial lines a previous agent had read (adoption).
func (w *Worker) serve(a spawnArgs, spec *Spec, c *channels, pending map[string][]byte) {
	uid := os.Getuid()
	if spec.Credential != nil {
		uid = int(spec.Credential.Uid)
	}
	w.pz, w.notify, w.onReady = newPauser(pending), c.notify, a.onReady
	if steerable(spec) {
		w.steerReady = a.steerReady
	}
	stopHealth := w.checkHealth(spec, c.healthAddr, a.healthFailed)
	w.ends = map[string]*os.File{"out": c.outR, "err": c.errR}
	var notifyDone sync.WaitGroup
	notifyDone.Add(1)
	w.pz.add(c.notify)
	go func() {
		defer notifyDone.Done()
		warnedListen := false // one warning per worker: the app may repeat it at will
		w.pz.run("notify", func([]byte) ([]byte, error) {
			return nil, c.notify.Serve(func(_, from int, msg handoff.Notify) {
				// Only the worker's user (or root) may speak for it: a
				// fallback abstract socket's name is visible to every user.
				if from == uid || from == 0 {
					ignoreListen(a.log, msg, w.PID, &warnedListen)
					if spec.Ready.Mode == ReadyHTTP {
						delete(msg, "READY") // only the health path says ready
					}
					w.onNotify(msg)
				}
			})
		})
	}()
	var readers sync.WaitGroup
	readers.Add(2)
	w.pz.add(c.outR)
	w.pz.add(c.errR)
	go w.capture(&readers, "out", c.outR, c.outJ, a.out, a.app, spec.Ready)
	go w.capture(&readers, "err", c.errR, c.errJ, a.err, a.app, spec.Ready)
	// chans are the channels read until the worker is drained, pipes
	// every end closed then (the journals too).
	chans := []*os.File{c.outR, c.errR}
	var pipes []*os.File
	for name, j := range map[string]*logs.Journal{"outj": c.outJ, "errj": c.errJ} {
		if j != nil {
			w.ends[name] = j.File()
			pipes = append(pipes, j.File())
		}
	}
	if c.ipc != nil {
		readers.Add(1)
		w.pz.add(c.ipc.Parent)
		w.ends["ipc"] = c.ipc.Parent
		go w.readIPC(&readers, c.ipc.Parent)
		chans = append(chans, c.ipc.Parent)
	}
	if r, ok := sourceOf(spec).(sourceReader); ok {
		if name, f, read := r.reader(w, c, a.log); f != nil {
			readers.Add(1)
			w.pz.add(f)
			w.ends[name] = f
			go read(&readers, f)
			chans = append(chans, f)
		}
	}
	pipes = append(pipes, chans...)
	if spec.Ready.Mode == ReadyDelay && !w.isReady() {
		go w.readyAfterDelay(max(spec.Ready.Delay-time.Since(w.Started), 0))
	}
	go func() {
		w.wait(a.log, &readers, chans, pipes)
		w.trap.close()
		stopHealth()
		c.notify.Close()
		notifyDone.Wait()
		w.finish()
	}()
}

// openJournals gives the output pipes their journals (logs.Journal); without
// memfds the output is read as before, and said so.
func (c *channels) openJournals(a spawnArgs) {
	var err error
	if c.outJ, err = logs.NewJournal("out"); err == nil {
		c.errJ, err = logs.NewJournal("err")
	}
	if err != nil {
		c.closeJournals()
		if a.log != nil {
			a.log.Warn("no journal for the worker's output: an agent crash may lose its last lines", "error", err)
		}
	}
}

// closeJournals closes the agent's copies of the journals.
func (c *channels) closeJournals() {
	for _, j := range []*logs.Journal{c.outJ, c.errJ} {
		if j != nil {
			j.Close()
		}
	}
	c.outJ, c.errJ = nil, nil
}
