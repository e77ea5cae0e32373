package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/atomicfile"
	"github.com/deployd/deployd/workers"
)

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
	// anyone saw them ready (markReady): Apps may not say so yet.
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

// recordsDir is where the agents sharing stateDir keep their records.
func recordsDir(stateDir string) string { return filepath.Join(stateDir, "agents") }

// recordBook is this agent's record on disk (survivors.go says why it
// exists): it serializes its writes, the recorder's (what runs) and
// beforeStart's (what is about to). mu is held only around the file write;
// nothing under it calls a supervisor (beforeStart runs in their loops).
// It knows the agent's workers only through the processes func its
// recorder is given.
type recordBook struct {
	log      hclog.Logger
	stateDir string
	marker   string        // every worker's DEPLOYD_AGENT_ID (strays.go)
	changed  chan struct{} // wakes the recorder

	mu       sync.Mutex
	written  map[string][]workers.Process // the processes the record on disk names
	starting []startingWorker
	ready    map[int]readyMark // markReady's, while their processes run
}

// newRecordBook is the record book of this agent, sharing stateDir.
func newRecordBook(stateDir string, log hclog.Logger) *recordBook {
	return &recordBook{log: log, stateDir: stateDir, marker: agentMarker(stateDir), changed: make(chan struct{}, 1)}
}

func (b *recordBook) path() string {
	return filepath.Join(recordsDir(b.stateDir), strconv.Itoa(os.Getpid())+".json")
}

// run writes the record whenever what runs (processes) changes, until
// stop is closed. Run by the agent's run group.
func (b *recordBook) run(stop <-chan struct{}, processes func() map[string][]workers.Process) {
	t := time.NewTicker(recordEvery)
	defer t.Stop()
	for {
		if cur := processes(); !b.names(cur) {
			if err := b.write(cur); err != nil {
				b.log.Warn("record the running workers", "error", err)
			}
		}
		select {
		case <-stop:
			return
		case <-b.changed:
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

// poke wakes the recorder (workers.Options.Changed); safe to call from any
// goroutine.
func (b *recordBook) poke() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// write writes the record of what runs: apps.
func (b *recordBook) write(apps map[string][]workers.Process) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Not pruned by apps: a snapshot taken before a worker started would
	// drop the mark markReady has just written for it.
	for pid, m := range b.ready {
		if !handoff.Running(pid, m.Start) {
			delete(b.ready, pid)
		}
	}
	if err := b.put(apps, nil); err != nil {
		return err
	}
	b.written, b.starting = apps, nil
	return nil
}

// markReady is workers.Options.OnReady: it writes the record with pid
// ready before the worker is seen ready, so that if this agent dies the
// next one adopts it ready (its readiness message was read here). Called
// from a worker's reader: it must not call a supervisor.
func (b *recordBook) markReady(pid int) {
	start, err := handoff.StartTime(pid)
	if err != nil {
		return // gone already
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ready == nil {
		b.ready = map[int]readyMark{}
	}
	b.ready[pid] = readyMark{At: time.Now(), Start: start}
	if err := b.put(b.written, b.starting); err != nil {
		b.log.Warn("record a ready worker", "pid", pid, "error", err)
	}
}

// beforeStart returns app's workers.Options.BeforeStart: it writes the
// record, with the worker about to start, before the worker starts; an
// error (state_dir full, read-only) refuses the start. Called from the
// supervisor's loop: it must not call the supervisor.
func (b *recordBook) beforeStart(app string) func(slot int) error {
	return func(slot int) error {
		b.mu.Lock()
		starting := append(b.starting, startingWorker{App: app, Slot: slot, At: time.Now()})
		starting = starting[max(len(starting)-maxStarting, 0):]
		err := b.put(b.written, starting)
		if err == nil {
			b.starting = starting
		}
		b.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%w; free space in state_dir %s (or make it writable), then try again",
				err, b.stateDir)
		}
		b.poke()
		return nil
	}
}

// put writes the record file. Called with mu held.
func (b *recordBook) put(apps map[string][]workers.Process, starting []startingWorker) error {
	if err := os.MkdirAll(recordsDir(b.stateDir), 0o700); err != nil {
		return err
	}
	start, _ := handoff.StartTime(os.Getpid())
	data, err := json.Marshal(agentRecord{AgentPID: os.Getpid(), AgentStart: start, Marker: b.marker,
		Apps: apps, Starting: starting, Ready: b.ready})
	if err != nil {
		return err
	}
	return atomicfile.WriteFileNoSymlinks(b.path(), data, 0o600)
}

// remove is the last step of a clean exit: nothing of this agent is left
// to retire (its workers are stopped or the next agent recorded them).
func (b *recordBook) remove() {
	_ = os.Remove(b.path())
}
