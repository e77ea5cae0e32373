package workers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
)

// Handover describes one running worker that an agent hands to the next
// one across a handoff; the next agent adopts it (Adopt) without a signal
// to the process. It crosses as JSON; its channel ends cross as files.
type Handover struct {
	Slot       int    `json:"slot"`
	PID        int    `json:"pid"`
	StartTime  uint64 `json:"start_time"` // /proc/PID/stat field 22
	Generation int    `json:"generation"`
	Release    string `json:"release"`
	// Identity is its spec's (Spec.Identity): the next agent adopts it only
	// if its own spec for the app has the same.
	Identity string    `json:"identity"`
	Started  time.Time `json:"started"`
	ReadyAt  time.Time `json:"ready_at"`
	Status   string    `json:"status,omitempty"`
	// Restarts and the monitor's replacements are the slot's counters.
	Restarts             int `json:"restarts"`
	MemoryReplacements   int `json:"memory_replacements"`
	WatchdogReplacements int `json:"watchdog_replacements"`
	// StopSignal and StopTimeout let the next agent retire a worker it
	// does not adopt (its app was removed or changed) the way it was asked
	// to stop.
	StopSignal  syscall.Signal `json:"stop_signal"`
	StopTimeout time.Duration  `json:"stop_timeout"`
	// Pending is the start of a line each reader had read when it paused,
	// by stream (out, err, ipc, node).
	Pending map[string][]byte `json:"pending,omitempty"`
	// Streams names the files that cross with it, in order.
	Streams []string `json:"streams"`
	// Kept are the fd numbers at which the process holds copies of the
	// agent's ends, for an agent that comes after a crash (TakeBack).
	Kept map[string]int `json:"kept,omitempty"`
	// Unit finds the worker's unit (its cgroup, or its marker) again, to
	// kill what it leaves running when it exits; nil from an agent that
	// tracked none.
	Unit *procunit.Record `json:"unit,omitempty"`

	files map[string]*os.File
}

// Files returns the channel ends in Streams order (the sender's own: it
// must not close them).
func (h *Handover) Files() []*os.File {
	out := make([]*os.File, 0, len(h.Streams))
	for _, s := range h.Streams {
		out = append(out, h.files[s])
	}
	return out
}

// SetFiles gives the receiver's files, in Streams order; Adopt owns them.
func (h *Handover) SetFiles(fs []*os.File) {
	h.files = map[string]*os.File{}
	for i, s := range h.Streams {
		if i < len(fs) {
			h.files[s] = fs[i]
		}
	}
	for _, f := range fs[min(len(h.Streams), len(fs)):] {
		f.Close()
	}
}

// Close closes the files the handover owns: the notify socket's copy on the
// sender's side, every file on the receiver's once not adopted.
func (h *Handover) closeFiles(all bool) {
	for name, f := range h.files {
		if all || name == "notify" {
			f.Close()
		}
	}
}

// ReleaseFiles closes the sender's copy of the notify socket once sent.
func (h *Handover) ReleaseFiles() { h.closeFiles(false) }

// Identity names what the spec's workers run and how they are attached to
// the agent: two specs with the same can share workers (an agent upgrade
// adopts them). Timeouts, signals and limits are not part of it: they apply
// to adopted workers as to new ones.
func (s *Spec) Identity() string {
	type lis struct{ Key, Name string }
	id := struct {
		Release, Dir, Ready string
		Argv, Env           []string
		UID, GID            int64
		Groups              []uint32
		Listeners           []lis
		Node, Indirect, Pin bool
	}{Release: s.Release, Dir: s.Dir, Ready: identityReady(s.Ready.Mode), Argv: s.Argv,
		Env: slices.DeleteFunc(slices.Clone(s.Env), perInvocation), UID: -1, GID: -1, Pin: s.CPUAffinity}
	sort.Strings(id.Env)
	if c := s.Credential; c != nil {
		id.UID, id.GID, id.Groups = int64(c.Uid), int64(c.Gid), c.Groups
	}
	for _, l := range s.Listeners {
		id.Listeners = append(id.Listeners, lis{l.Key(), l.Name})
	}
	if s.Node != nil {
		id.Node, id.Indirect = true, s.Node.Indirect
	}
	b, _ := json.Marshal(id)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// perInvocation reports whether kv is a variable that systemd sets anew
// for each start of the agent's unit (its invocation, its stdout stream, the
// pid it started): workers inherit them, but an agent that Restart= brought
// after a crash has other values, and its workers are no other for that.
func perInvocation(kv string) bool {
	k, _, _ := strings.Cut(kv, "=")
	switch k {
	case "INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "MANAGERPID", "MAINPID":
		return true
	}
	return false
}

// PoolHandover is the state of an app's pool that crosses an agent upgrade
// with its workers: the next agent takes the app over in the state it is in
// (errored stays errored, a slot waiting for its crash restart restarts when
// it was due, with its backoff and crash count), and status shows the same
// counters and last exit as before.
type PoolHandover struct {
	State     AppState `json:"state"`
	LastExit  string   `json:"last_exit,omitempty"`
	LastLines []string `json:"last_lines,omitempty"`
	// Slots carry the restart counts status shows; Counters (metrics)
	// count from each agent's start, as a process's counters do.
	Slots []SlotHandover `json:"slots"`
	// Healthy: running, every slot's worker ready. Only such an app's
	// readiness under the next agent can tell that agent is broken.
	Healthy bool `json:"healthy"`
}

// SlotHandover is one slot of a PoolHandover.
type SlotHandover struct {
	Index int `json:"index"`
	// PID is the slot's current worker (0: none); Exit says how it ended
	// when it is no longer running (its slot waits for a crash restart, or
	// the app is errored).
	PID  int    `json:"pid,omitempty"`
	Exit string `json:"exit,omitempty"`
	// Restarts, Crashes (within the restart window) and Backoff are the
	// crash policy's counters; RestartAt, when set, is when its crash
	// restart is due.
	Restarts  int           `json:"restarts"`
	Crashes   []time.Time   `json:"crashes,omitempty"`
	Backoff   time.Duration `json:"backoff"`
	RestartAt time.Time     `json:"restart_at,omitzero"`

	MemoryReplacements   int `json:"memory_replacements"`
	WatchdogReplacements int `json:"watchdog_replacements"`
	HealthReplacements   int `json:"health_replacements"`
	// Position is the slot's place in the kernel's steering map (steer.go),
	// nil for a spare or a shared pool. ConnBase is the place's connection
	// count when the slot's worker took it (the worker's own count is the
	// place's count minus it), nil when not known.
	Position *int    `json:"position,omitempty"`
	ConnBase *uint64 `json:"conn_base,omitempty"`
}

// handover is what a supervisor handed over: its frozen operation, the
// workers described, and the crash restarts that fell due meanwhile (run
// by Resume; after Release the next agent restarts those slots).
type handover struct {
	op      *op
	workers map[*Worker]bool
	due     []func(*state)
}

// HandOver is HandOverPool without the pool's state.
func (s *Supervisor) HandOver() ([]*Handover, error) {
	_, hs, err := s.HandOverPool()
	return hs, err
}

// HandOverPool freezes the pool for an agent upgrade (other operations get
// a *BusyError, crash restarts wait), pauses the readers of every current
// worker that runs (ready, or starting after a crash restart) and
// describes them with the pool's state. The caller passes them on, then
// calls Resume (the handoff failed: nothing changed) or Release (the next
// agent has them). A worker being replaced, or one that cannot be
// described, is not handed over: the next agent starts a worker for its
// slot and this one stops it in Release; one that exited meanwhile is
// described as exited (the next agent counts the crash and restarts the
// slot after its backoff).
func (s *Supervisor) HandOverPool() (*PoolHandover, []*Handover, error) {
	o, err := s.begin("agent upgrade", nil)
	if err != nil {
		return nil, nil, err
	}
	var items []*Worker
	ho := &handover{op: o, workers: map[*Worker]bool{}}
	var pool *PoolHandover
	o.change(func(st *state) {
		pool = st.poolHandover()
		for _, sl := range st.slots {
			w := sl.cur
			if w == nil || w.pz == nil || len(sl.extra) > 0 {
				continue
			}
			if ws := w.State(); ws != Ready && ws != Starting {
				continue
			}
			items = append(items, w)
			ho.workers[w] = true
		}
		st.handover = ho
	})
	var out []*Handover
	for _, w := range items {
		h := w.describe()
		if h == nil {
			// Not described: it keeps being read here, and the next agent
			// starts a worker for its slot; Release stops this one.
			o.change(func(*state) { delete(ho.workers, w) })
			if !handoff.Running(w.PID, w.startTime) {
				for i := range pool.Slots {
					if pool.Slots[i].Index == w.Slot && pool.Slots[i].Exit == "" {
						pool.Slots[i].Exit = "exited during the agent upgrade"
					}
				}
			}
			continue
		}
		for _, ps := range pool.Slots {
			if ps.Index == h.Slot {
				h.Restarts, h.MemoryReplacements, h.WatchdogReplacements =
					ps.Restarts, ps.MemoryReplacements, ps.WatchdogReplacements
			}
		}
		out = append(out, h)
	}
	return pool, out, nil
}

// poolHandover describes the pool's state. Run by the loop.
func (st *state) poolHandover() *PoolHandover {
	p := &PoolHandover{State: st.app, LastExit: st.lastExit, LastLines: slices.Clone(st.lastLines),
		Healthy: st.app == AppRunning}
	for _, sl := range st.slots {
		ps := SlotHandover{Index: sl.index, Restarts: sl.restarts, Crashes: slices.Clone(sl.crashes),
			Backoff: sl.backoff, MemoryReplacements: sl.memoryReplacements,
			WatchdogReplacements: sl.watchdogReplacements, HealthReplacements: sl.healthReplacements}
		if sl.timer != nil {
			ps.RestartAt = sl.restartAt
		}
		if p, ok := st.pos[sl]; ok {
			ps.Position = &p
			if base, ok := st.connBase[sl.cur]; ok {
				ps.ConnBase = &base
			}
		}
		if w := sl.cur; w != nil {
			ps.PID = w.PID
			if w.State() == Exited {
				ps.Exit = w.ExitDescription()
			}
		}
		if sl.cur == nil || sl.cur.State() != Ready || len(sl.extra) > 0 {
			p.Healthy = false
		}
		p.Slots = append(p.Slots, ps)
	}
	return p
}

// describe pauses w's readers and describes it, nil if its notify socket
// cannot be copied (it is then not handed over: it keeps reading).
func (w *Worker) describe() *Handover {
	nf, err := w.notify.File()
	if err != nil {
		return nil
	}
	pending, ok := w.pz.pause()
	if !ok { // it exited: its waiter closes its ends
		nf.Close()
		return nil
	}
	w.mu.Lock()
	h := &Handover{Slot: w.Slot, PID: w.PID, StartTime: w.startTime, Generation: w.Generation,
		Release: w.Release, Identity: w.spec.Identity(), Started: w.Started, ReadyAt: w.readyAt,
		Status: w.status, StopSignal: w.spec.StopSignal, StopTimeout: w.spec.StopTimeout, Pending: pending,
		Kept: w.kept, Unit: w.unitRecord(), files: map[string]*os.File{"notify": nf}}
	members := w.members
	w.mu.Unlock()
	h.Streams = append(h.Streams, "notify")
	for _, name := range []string{"out", "err", "outj", "errj", "ipc", "node"} {
		if f := w.ends[name]; f != nil {
			h.files[name] = f
			h.Streams = append(h.Streams, name)
		}
	}
	if hs, ok := sourceOf(w.spec).(sourceHandoff); ok {
		if name, f := hs.handoff(w); f != nil {
			h.files[name] = f
			h.Streams = append(h.Streams, name)
		}
	}
	// A worker not yet in the steering map crosses with its own sockets,
	// for the next agent to put it there once it is ready.
	for i, m := range members {
		if f := m.sock.File(); f != nil {
			name := steerStream(i)
			h.files[name] = f
			h.Streams = append(h.Streams, name)
		}
	}
	return h
}

// Resume undoes HandOver after a failed handoff: the readers read on,
// operations are admitted again and the crash restarts that fell due
// meanwhile run.
func (s *Supervisor) Resume() {
	var ho *handover
	s.call(func(st *state) {
		ho, st.handover = st.handover, nil
		if ho != nil {
			for _, fn := range ho.due {
				fn(st)
			}
		}
	})
	if ho == nil {
		return
	}
	for w := range ho.workers {
		w.pz.resume()
	}
	ho.op.end()
}

// Release ends the supervisor after a successful handoff: the workers it
// handed over keep running untouched (the next agent has them; their
// readers here end), every other one is stopped as by Stop. Without a
// HandOver it is Stop. Safe to call twice; Stop after it does nothing.
func (s *Supervisor) Release() { s.stopOnce.Do(s.release) }

func (s *Supervisor) release() {
	var ho *handover
	s.call(func(st *state) { ho, st.handover = st.handover, nil })
	if ho == nil {
		s.stop()
		return
	}
	for w := range ho.workers {
		w.pz.release()
	}
	s.call(func(st *state) {
		st.closing = true
		close(s.cancel)
		st.handedOver = ho.workers
	})
	ho.op.end()
	o := s.newOp("stop", "", nil)
	o.stopAll(Stopping) // skips the handed-over workers
	o.change(func(st *state) { st.closeSubs() })
	close(s.quit)
	<-s.done
	// Not s.wg.Wait(): the watchers of handed-over workers wait for
	// processes that outlive this agent.
}
