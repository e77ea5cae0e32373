package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/atomicfile"
	"github.com/deployd/deployd/internal/boundedfile"
	"github.com/deployd/deployd/workers"
)

// Workers outlive the agent that started them (a next agent adopts them
// across a handoff), so an agent that dies without one (SIGKILL, a crash)
// leaves them running. Every agent therefore records the worker processes
// it runs in state_dir/agents/<pid>.json; an agent that starts finds the
// records of agents that are gone and adopts their survivors as an upgrade
// would have handed them over (adoptSurvivors): each worker keeps copies of
// the agent's ends of its channels (handoff/keep.go), which the new agent
// copies back out of it. Those it cannot adopt (gone, pid reused, no kept
// channels, an app removed or changed) it retires once its own workers are
// ready. A clean exit removes the record.
//
// The record is written before each worker starts (beforeStart), and a
// start it cannot write (state_dir full) is refused. Every worker also
// carries its agent's marker in its environment (DEPLOYD_AGENT_ID: this
// state_dir, the agent's pid and start time), so that an agent that starts
// also finds, in /proc, the workers of a dead agent that no record names,
// and retires them too (strays).

// recordEvery bounds how stale a record can be; supervisors' changes
// trigger a write at once, so this only catches a change none signalled.
// Each check builds the list of processes: once a second, that garbage
// alone grew an idle agent's heap by ~1 KB/s (BENCHMARKS.md, "Agent memory").
const recordEvery = 10 * time.Second

// maxAgentRecord bounds an agent's record: about 200 bytes a worker.
const maxAgentRecord = 64 << 20

// agentRecord is one agent's record.
type agentRecord struct {
	AgentPID   int                          `json:"agent_pid"`
	AgentStart uint64                       `json:"agent_start"`
	Marker     string                       `json:"marker,omitempty"`
	Apps       map[string][]workers.Process `json:"apps"`
	// Starting are the workers announced by beforeStart since the last
	// record of what runs: found by their marker if the agent dies.
	Starting []startingWorker `json:"starting,omitempty"`
	// Ready are the workers (by pid) that got ready, recorded before
	// anyone saw them ready (recordReady): Apps may not say so yet.
	Ready map[int]readyMark `json:"ready,omitempty"`
}

// readyMark is when a worker process (its pid, and start time) got ready.
type readyMark struct {
	At    time.Time `json:"at"`
	Start uint64    `json:"start_time"`
}

// startingWorker is a worker about to start.
type startingWorker struct {
	App  string    `json:"app"`
	Slot int       `json:"slot"`
	At   time.Time `json:"at"`
}

// maxStarting bounds the announced starts a record keeps.
const maxStarting = 64

// recordBook serializes the writes of this agent's record, the recorder's
// (what runs) and beforeStart's (what is about to). mu is held only around
// the file write; nothing under it calls a supervisor (beforeStart runs in
// their loops).
type recordBook struct {
	mu       sync.Mutex
	written  map[string][]workers.Process // the processes the record on disk names
	starting []startingWorker
	ready    map[int]readyMark // recordReady's, while their processes run
}

func (a *Agent) recordsDir() string { return filepath.Join(a.settings.StateDir, "agents") }

func (a *Agent) recordPath() string {
	return filepath.Join(a.recordsDir(), strconv.Itoa(os.Getpid())+".json")
}

// recorder writes this agent's record whenever what runs changes, until
// stop is closed. Run by the agent's run group.
func (a *Agent) recorder(stop <-chan struct{}) {
	t := time.NewTicker(recordEvery)
	defer t.Stop()
	for {
		if cur := a.processes(); !a.book.names(cur) {
			if err := a.writeRecord(cur); err != nil {
				a.log.Warn("record the running workers", "error", err)
			}
		}
		select {
		case <-stop:
			return
		case <-a.changed:
		case <-t.C:
		}
	}
}

// names reports whether the record on disk names exactly ps and no start
// is pending.
func (b *recordBook) names(ps map[string][]workers.Process) bool {
	b.mu.Lock()
	starting, written := len(b.starting), b.written // replaced whole, never changed in place
	b.mu.Unlock()
	return starting == 0 && reflect.DeepEqual(ps, written)
}

// processesChanged wakes the recorder; safe to call from any goroutine.
func (a *Agent) processesChanged() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *Agent) processes() map[string][]workers.Process {
	out := map[string][]workers.Process{}
	for _, rt := range a.appList() {
		if ps := rt.sup.Processes(); len(ps) > 0 {
			withLearned(ps, rt.running().Learned())
			out[rt.name] = ps
		}
	}
	return out
}

// withLearned adds to each process's listeners those its app learned from
// its binds (learn.go): the workers hold them at fds of their own, and the
// agent after a crash takes them back from one (survivorSockets) as it
// takes the others.
func withLearned(ps []workers.Process, learned []handoff.Bound) {
	for i := range ps {
		for _, b := range learned {
			ps[i].Listen = append(ps[i].Listen, workers.Listen{Network: b.Network, Address: b.Address})
		}
	}
}

// writeRecord writes the record of what runs: apps.
func (a *Agent) writeRecord(apps map[string][]workers.Process) error {
	a.book.mu.Lock()
	defer a.book.mu.Unlock()
	// Not pruned by apps: a snapshot taken before a worker started would
	// drop the mark recordReady has just written for it.
	for pid, m := range a.book.ready {
		if !handoff.Running(pid, m.Start) {
			delete(a.book.ready, pid)
		}
	}
	if err := a.putRecord(apps, nil); err != nil {
		return err
	}
	a.book.written, a.book.starting = apps, nil
	return nil
}

// recordReady is workers.Options.OnReady: it writes the record with pid
// ready before the worker is seen ready, so that if this agent dies the
// next one adopts it ready (its readiness message was read here). Called
// from a worker's reader: it must not call a supervisor.
func (a *Agent) recordReady(pid int) {
	start, err := handoff.StartTime(pid)
	if err != nil {
		return // gone already
	}
	a.book.mu.Lock()
	defer a.book.mu.Unlock()
	if a.book.ready == nil {
		a.book.ready = map[int]readyMark{}
	}
	a.book.ready[pid] = readyMark{At: time.Now(), Start: start}
	if err := a.putRecord(a.book.written, a.book.starting); err != nil {
		a.log.Warn("record a ready worker", "pid", pid, "error", err)
	}
}

// beforeStart returns app's workers.Options.BeforeStart: it writes the
// record, with the worker about to start, before the worker starts; an
// error (state_dir full, read-only) refuses the start. Called from the
// supervisor's loop: it must not call the supervisor.
func (a *Agent) beforeStart(app string) func(slot int) error {
	return func(slot int) error {
		a.book.mu.Lock()
		starting := append(a.book.starting, startingWorker{App: app, Slot: slot, At: time.Now()})
		starting = starting[max(len(starting)-maxStarting, 0):]
		err := a.putRecord(a.book.written, starting)
		if err == nil {
			a.book.starting = starting
		}
		a.book.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%w; free space in state_dir %s (or make it writable), then try again",
				err, a.settings.StateDir)
		}
		a.processesChanged()
		return nil
	}
}

// putRecord writes the record file. Called with book.mu held.
func (a *Agent) putRecord(apps map[string][]workers.Process, starting []startingWorker) error {
	if err := os.MkdirAll(a.recordsDir(), 0o700); err != nil {
		return err
	}
	start, _ := handoff.StartTime(os.Getpid())
	b, err := json.Marshal(agentRecord{AgentPID: os.Getpid(), AgentStart: start, Marker: a.marker,
		Apps: apps, Starting: starting, Ready: a.book.ready})
	if err != nil {
		return err
	}
	return atomicfile.WriteFileNoSymlinks(a.recordPath(), b, 0o600)
}

// removeRecord is the last step of a clean exit: nothing of this agent is
// left to retire (its workers are stopped or the next agent recorded them).
func (a *Agent) removeRecord() {
	_ = os.Remove(a.recordPath())
}

// survivor is a worker process that an agent which is gone left running.
type survivor struct {
	app      string
	p        workers.Process
	agentPID int
	// stray: no record named it; found by its marker (strays.go).
	stray bool
}

// survivors lists the workers left by agents that are gone (their records,
// which it returns too), then the strays no record names, except those this
// agent supervises (adopted). Agents still alive (a previous agent draining
// after a handoff) keep theirs.
func (a *Agent) survivors() (out []survivor, records []string) {
	ents, err := os.ReadDir(a.recordsDir())
	if err != nil {
		return nil, nil
	}
	mine := map[int]bool{}
	for _, ps := range a.processes() {
		for _, p := range ps {
			mine[p.PID] = true
		}
	}
	for _, e := range ents {
		path := filepath.Join(a.recordsDir(), e.Name())
		pid, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".json"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := boundedfile.ReadFile(path, boundedfile.Options{Max: maxAgentRecord, NoSymlinks: true})
		var rec agentRecord
		if err != nil || json.Unmarshal(b, &rec) != nil {
			records = append(records, path)
			continue
		}
		if handoff.Running(pid, rec.AgentStart) {
			continue // that agent lives
		}
		records = append(records, path)
		for app, ps := range rec.Apps {
			for _, p := range ps {
				// Each process once: an agent killed while it took over
				// from a dead one left a second record naming it.
				if !mine[p.PID] && !slices.ContainsFunc(out, func(s survivor) bool { return s.p.PID == p.PID }) {
					if m, ok := rec.Ready[p.PID]; ok && m.Start == p.StartTime && p.ReadyAt.IsZero() {
						p.ReadyAt = m.At
					}
					out = append(out, survivor{app: app, p: p, agentPID: rec.AgentPID})
				}
			}
		}
	}
	known := mine
	for _, s := range out {
		known[s.p.PID] = true
	}
	units := map[string]bool{} // of the workers known, which end what they left
	for _, ps := range a.processes() {
		for _, p := range ps {
			if p.Unit != nil {
				units[p.Unit.ID] = true
			}
		}
	}
	for _, s := range out {
		if s.p.Unit != nil {
			units[s.p.Unit.ID] = true
		}
	}
	return append(out, a.strays(known, units)...), records
}

// survivorSockets copies the listening sockets of one live survivor per app
// (pidfd_getfd): they are still bound, so the registry adopts them as it
// adopts systemd's instead of failing to bind the address again. The
// survivors serve until this agent's workers are ready.
func (a *Agent) survivorSockets(ss []survivor) []*handoff.Activated {
	done := map[string]bool{}
	var out []*handoff.Activated
	for _, s := range ss {
		if done[s.app] || len(s.p.Listen) == 0 {
			continue
		}
		pfd, err := handoff.OpenPidfd(s.p.PID, s.p.StartTime)
		if err != nil {
			continue
		}
		held, err := pfd.Listeners()
		pfd.Close()
		// Only the sockets its app listens on, each once.
		var got []*handoff.Activated
		for _, l := range held {
			if len(got) < len(s.p.Listen) && slices.ContainsFunc(s.p.Listen, func(w workers.Listen) bool {
				return l.Matches(w.Network, w.Address)
			}) {
				got = append(got, l)
			} else {
				l.Close()
			}
		}
		if err != nil || len(got) < len(s.p.Listen) {
			// Exiting (a worker whose agent died gets EPIPE, often SIGPIPE,
			// at its next output line) or not holding them: try the next one,
			// and let a dying one free its address first.
			a.log.Info("no listeners to take back from a worker left by a dead agent", "app", s.app, "pid", s.p.PID,
				"found", len(got), "want", len(s.p.Listen), "error", err)
			for _, l := range got {
				l.Close()
			}
			waitGone(s.p, 2*time.Second)
			continue
		}
		done[s.app] = true
		for _, l := range got {
			l.From = fmt.Sprintf("a worker left by a dead agent (pid %d, agent pid %d)", s.p.PID, s.agentPID)
		}
		out = append(out, got...)
		a.log.Info("took the listeners back from a worker left by a dead agent", "app", s.app, "pid", s.p.PID,
			"agent_pid", s.agentPID, "listeners", len(got))
	}
	return out
}

// waitGone waits up to bound for p to exit.
func waitGone(p workers.Process, bound time.Duration) {
	pfd, err := handoff.OpenPidfd(p.PID, p.StartTime)
	if err != nil {
		return
	}
	defer pfd.Close()
	waitPidfd(pfd, bound)
}

// waitPidfd waits up to bound for pfd's process to exit, and reports
// whether it did. pfd is closed when it did not (that ends the wait).
func waitPidfd(pfd *handoff.Pidfd, bound time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = pfd.Wait(); close(done) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		pfd.Close() // ends the Wait
		<-done
		return false
	}
}

// endDeadSurvivors kills, before this agent binds its listeners, what the
// survivors that died while no agent ran left running (workers.EndIfGone):
// a daemon of theirs would hold the app's address.
func (a *Agent) endDeadSurvivors(ss []survivor) {
	for _, s := range ss {
		left, err := workers.EndIfGone(s.p)
		for _, p := range left {
			a.log.Warn("a worker left by an agent that died had exited, and left a process running; killed it",
				"app", s.app, "worker", s.p.Slot, "worker_pid", s.p.PID, "pid", p.PID, "command", p.Name)
		}
		if err != nil {
			a.log.Error("a worker left by an agent that died left processes that could not be killed", "app", s.app,
				"worker", s.p.Slot, "worker_pid", s.p.PID, "error", err)
		}
	}
}

// retire stops every survivor (its stop signal, stop_timeout, then SIGKILL
// to its group) and removes the records they came from.
func (a *Agent) retire(ss []survivor, records []string) {
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() {
			left, err := workers.Retire(s.p)
			for _, p := range left {
				a.log.Warn("a worker left by an agent that died left a process running; killed it", "app", s.app,
					"worker", s.p.Slot, "worker_pid", s.p.PID, "pid", p.PID, "command", p.Name)
			}
			switch {
			case err == nil && s.stray:
				a.log.Warn("retired a stray worker of an agent that died: no record named it (its agent died before "+
					"recording it, or could not write state_dir)", "app", s.app, "worker", s.p.Slot, "pid", s.p.PID,
					"agent_pid", s.agentPID)
			case err == nil:
				a.log.Info("retired a worker left by an agent that died", "app", s.app, "worker", s.p.Slot,
					"pid", s.p.PID, "agent_pid", s.agentPID)
			}
		})
	}
	wg.Wait()
	for _, r := range records {
		_ = os.Remove(r)
	}
}

// retireLater retires survivors now that this agent's workers are ready:
// those found at start; with a previous agent, those of agents gone once
// it has exited (until then it owns its record, and it may be draining).
// False when the previous agent did not exit in time: it still runs.
func (a *Agent) retireLater() bool {
	if !a.upg.HasParent() {
		a.retire(a.found, a.foundRecords)
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.settings.UpgradeTimeout+time.Minute)
	err := a.upg.WaitForParent(ctx)
	cancel()
	if err != nil {
		return false
	}
	a.retire(a.survivors())
	return true
}

// adoptSurvivors takes back (workers.TakeBack) every recorded survivor that
// still holds its channels, as the handover of an agent upgrade would have
// described it: startApps adopts them (same pids, no signal) into the apps
// whose spec they still match, and the rest are stopped once this agent
// serves. What cannot be taken back (pid gone or reused, an agent that kept
// nothing, a stray) stays in found, retired as before, and the log says why.
func (a *Agent) adoptSurvivors() *received {
	r := &received{byApp: map[string][]*workers.Handover{}, pools: map[string]*workers.PoolHandover{},
		unhealthy: map[string]bool{}}
	var left []survivor
	for _, s := range a.found {
		if s.stray {
			left = append(left, s)
			continue
		}
		h, err := workers.TakeBack(s.p)
		if err != nil {
			a.log.Warn("worker left by an agent that died cannot be adopted; it will be retired", "app", s.app,
				"worker", s.p.Slot, "pid", s.p.PID, "agent_pid", s.agentPID, "error", err)
			left = append(left, s)
			continue
		}
		a.log.Info("taking over a worker left by an agent that died", "app", s.app, "worker", s.p.Slot,
			"pid", s.p.PID, "agent_pid", s.agentPID)
		r.byApp[s.app] = append(r.byApp[s.app], h)
	}
	// The newest generation first: a slot's replacement rather than the
	// worker it was replacing when the agent died (the other is stopped).
	for _, hs := range r.byApp {
		slices.SortStableFunc(hs, func(x, y *workers.Handover) int { return y.Generation - x.Generation })
	}
	a.found = left
	return r
}
