package workers

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/logs"
)

// Adopt starts the pool on its spec from workers a previous agent handed
// over (hs, with their files set): each whose process is still the
// recorded one (pid and start time, through a pidfd) and whose spec
// identity is the pool's becomes its slot's worker, untouched — no signal,
// same pid, its output and notify messages read on from where the previous
// agent paused. Every other slot gets a new worker, waited for as by Start.
// Handed-over workers it does not adopt (another spec, a slot beyond the
// instances, a duplicate) are kept aside as leftovers: StopLeftovers stops
// them (their own stop signal) once the agent has taken over; until then
// they belong to the previous agent. With no handovers it is Start.
func (s *Supervisor) Adopt(hs []*Handover) error { return s.AdoptPool(nil, hs) }

// AdoptPool is Adopt that also takes the pool over in the state the
// previous agent described (pool, nil when it sent none): the app keeps
// its state (errored stays errored) and its last exit, each slot its
// counters and backoff; a slot whose worker had exited restarts when its
// crash restart was due (never, in an errored app), and one whose worker
// exited during the handoff counts a crash, as it would have under the
// previous agent. Only the workers it starts in slots the pool does not
// describe are waited for.
func (s *Supervisor) AdoptPool(pool *PoolHandover, hs []*Handover) error {
	o, err := s.begin("adopt the running workers", nil)
	if err != nil {
		for _, h := range hs {
			h.closeFiles(true)
		}
		return err
	}
	defer o.end()
	spec := s.Spec()
	id := spec.Identity()
	adopted := map[int]*Worker{}
	counters := map[int]*Handover{}
	gone := map[int]bool{} // handed over, no longer running
	var retire []*Worker
	var took []adoption
	for _, h := range hs {
		match := h.Identity == id && h.Slot >= 0 && h.Slot < spec.Instances && adopted[h.Slot] == nil
		wspec := spec
		if !match {
			ws := *spec
			ws.StopSignal, ws.StopTimeout, ws.Node = h.StopSignal, h.StopTimeout, nil
			wspec = &ws
		}
		w, c, err := adoptWorker(s.args(), wspec, h)
		if err != nil {
			s.log.Warn("worker of the previous agent not adopted", "worker", h.Slot, "pid", h.PID, "error", err)
			if match {
				gone[h.Slot] = true
			}
			continue
		}
		took = append(took, adoption{w, wspec, c, h.Pending})
		if !match {
			s.log.Info("retiring a worker of the previous agent: its spec differs", "worker", h.Slot, "pid", h.PID)
			retire = append(retire, w)
			continue
		}
		adopted[h.Slot], counters[h.Slot] = w, h
	}
	serveAdopted(s.args(), took)
	o.change(func(st *state) {
		st.leftovers = retire
		st.adopted = map[*Worker]bool{}
		for _, w := range adopted {
			st.adopted[w] = true
		}
	})
	return o.startAdopting(spec, adopted, counters, &poolPlan{pool: pool, gone: gone})
}

// Restore gives a pool that does not run (a stopped app) the state a
// previous agent described: its last exit. It changes no worker.
func (s *Supervisor) Restore(pool *PoolHandover) {
	if pool == nil {
		return
	}
	s.call(func(st *state) {
		st.lastExit, st.lastLines = pool.LastExit, slices.Clone(pool.LastLines)
	})
}

// poolPlan is what startAdopting takes over besides the workers: the
// previous agent's description of the pool (nil pool: none), and the slots
// whose handed-over worker was gone.
type poolPlan struct {
	pool *PoolHandover
	gone map[int]bool
}

// slot returns the description of slot i, nil when there is none.
func (p *poolPlan) slot(i int) *SlotHandover {
	if p == nil || p.pool == nil {
		return nil
	}
	for k := range p.pool.Slots {
		if p.pool.Slots[k].Index == i {
			return &p.pool.Slots[k]
		}
	}
	return nil
}

// restore gives sl the counters of its description. Run by the loop.
func (ps *SlotHandover) restore(sl *slot) {
	sl.restarts, sl.crashes, sl.backoff = ps.Restarts, slices.Clone(ps.Crashes), ps.Backoff
	sl.memoryReplacements, sl.watchdogReplacements, sl.healthReplacements =
		ps.MemoryReplacements, ps.WatchdogReplacements, ps.HealthReplacements
}

// StopLeftovers stops the handed-over workers Adopt did not adopt; call it
// once this agent has taken over from the previous one.
func (s *Supervisor) StopLeftovers() {
	var ws []*Worker
	s.call(func(st *state) { ws, st.leftovers = st.leftovers, nil })
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { w.stop(Stopping, s.log) })
	}
	wg.Wait()
}

// LetGo ends a supervisor of an agent that gives up before it took over:
// it stops the workers it started and leaves every worker it adopted (and
// the leftovers) to the previous agent, which keeps them. Safe to call
// twice; after Stop or Release it does nothing.
func (s *Supervisor) LetGo() {
	s.stopOnce.Do(func() {
		var running *opInfo
		var theirs []*Worker
		s.call(func(st *state) {
			st.closing = true
			close(s.cancel)
			running = st.op
			st.handedOver = st.adopted
			theirs = append(slices.Collect(maps.Keys(st.adopted)), st.leftovers...)
			st.leftovers = nil
		})
		// Stop reading their channels before the previous agent reads them
		// again: what was read is in the sinks (the agent flushes them as it
		// exits), the rest waits in the pipes for the previous agent.
		for _, w := range theirs {
			s.giveBack(w)
		}
		if running != nil {
			<-running.done
		}
		o := s.newOp("stop", "", nil)
		o.stopAll(Stopping) // skips the adopted workers
		o.change(func(st *state) { st.closeSubs() })
		close(s.quit)
		<-s.done
	})
}

// giveBack ends w's readers without touching its channels again. A partial
// line a reader held (the app wrote a line in several writes) cannot go
// back to the previous agent: it is lost, and logged.
func (s *Supervisor) giveBack(w *Worker) {
	if w.pz == nil {
		return
	}
	pending, _ := w.pz.pause()
	w.pz.release()
	for name, b := range pending {
		if len(b) > 0 {
			s.log.Warn("worker left to the previous agent: the start of a line it wrote is lost", "worker", w.Slot,
				"pid", w.PID, "stream", name, "bytes", len(b))
		}
	}
}

// startAdopting moves the pool to fresh slots of spec, puts the adopted
// workers (by slot) in theirs, takes over the state plan describes, and
// starts a worker in every other slot; then it waits until the workers it
// started (and the adopted ready ones) are ready or ready_timeout passes.
// Without adopted workers nor plan it is startAll.
func (o *op) startAdopting(spec *Spec, adopted map[int]*Worker, hs map[int]*Handover, plan *poolPlan) error {
	s := o.s
	var slots []*slot
	var pool *PoolHandover
	if plan != nil {
		pool = plan.pool
	}
	o.change(func(st *state) {
		slots = newSlots(0, spec.Instances, spec)
		s.setApp(st, AppStarting, func() {
			st.spec, st.slots = spec, slots
			if pool != nil {
				st.lastExit, st.lastLines = pool.LastExit, slices.Clone(pool.LastLines)
				st.pos = pool.positions(slots, adopted)
			}
		})
	})
	errored := pool != nil && pool.State == AppErrored
	var started []*Worker
	var errs []error
	for _, sl := range slots {
		ps := plan.slot(sl.index)
		if w := adopted[sl.index]; w != nil {
			h := hs[sl.index]
			s.log.Info("worker adopted", "worker", sl.index, "pid", w.PID, "release", w.Release, "state", w.State())
			o.publish(Event{Type: EventStarted, Slot: sl.index, PID: w.PID, Release: w.Release, Message: "adopted"},
				func(st *state) {
					sl.cur = w
					if ps != nil {
						ps.restore(sl)
						st.adoptConnBase(sl, ps)
					} else {
						sl.restarts, sl.memoryReplacements, sl.watchdogReplacements =
							h.Restarts, h.MemoryReplacements, h.WatchdogReplacements
					}
					st.sampleOne(s.fs, w)
					s.watch(sl, w)
					if !w.isReady() {
						s.watchReady(sl, w) // restarted after a crash: no operation waits for it
					}
				})
			if w.isReady() {
				started = append(started, w)
			}
			continue
		}
		if ps != nil && (ps.Exit != "" || plan.gone[sl.index] || errored) {
			o.takeOverExited(sl, spec, ps, plan.gone[sl.index], errored)
			continue
		}
		w, err := spawn(s.args(), spec, sl.index)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", sl.index, err))
			dw := deadWorker(sl.index, spec, err)
			o.publish(Event{Type: EventFailed, Slot: sl.index, Release: spec.Release, Message: err.Error()},
				func(st *state) {
					sl.cur = dw
					if ps != nil {
						ps.restore(sl)
					}
					s.watch(sl, dw)
				})
			continue
		}
		s.log.Info("worker started", "worker", sl.index, "pid", w.PID, "release", spec.Release)
		o.publish(Event{Type: EventStarted, Slot: sl.index, PID: w.PID, Release: spec.Release},
			func(st *state) {
				sl.cur = w
				if ps != nil {
					ps.restore(sl)
				}
				st.sampleOne(s.fs, w)
				s.watch(sl, w)
			})
		started = append(started, w)
	}
	errs = append(errs, o.waitAllReady(started, spec)...)
	o.change(func(st *state) {
		if st.app == AppStarting {
			to := AppRunning
			if errored {
				to = AppErrored
			}
			s.setApp(st, to, nil)
		}
	})
	return errors.Join(errs...)
}

// takeOverExited takes over slot sl whose worker had exited under the
// previous agent (ps.Exit), or exited during the handoff (gone): it keeps
// its counters and an exited worker in its place, and restarts it when
// its crash restart was due. An exit the previous agent had not yet
// counted (gone, or no restart due) is counted here as a crash. In an
// errored app nothing restarts.
func (o *op) takeOverExited(sl *slot, spec *Spec, ps *SlotHandover, gone, errored bool) {
	s := o.s
	desc := ps.Exit
	if gone || desc == "" {
		desc = "exited during the agent upgrade"
	}
	dw := deadWorker(sl.index, spec, errors.New(desc))
	dw.PID = ps.PID
	s.log.Info("slot taken over without a running worker", "worker", sl.index, "pid", ps.PID, "exit", desc,
		"restarts", ps.Restarts, "restart_at", ps.RestartAt)
	o.change(func(st *state) {
		sl.cur = dw
		ps.restore(sl)
		switch {
		case errored:
		case gone || ps.RestartAt.IsZero():
			s.watch(sl, dw) // counted as the crash it is
		default:
			sl.restartAt = ps.RestartAt
			sl.timer = time.AfterFunc(max(time.Until(ps.RestartAt), 0), func() {
				s.send(func(st *state) { s.restartSlot(st, sl, dw) })
			})
		}
	})
}

// adoption is a worker adopted and not served yet.
type adoption struct {
	w       *Worker
	spec    *Spec
	c       *channels
	pending map[string][]byte
}

// serveAdopted starts the adopted workers' goroutines, once every journal
// of theirs is settled (logs.Journal.Settle): an append a dead agent tore
// at the end of a log file can be cut off only while nothing follows it,
// and every worker of an app writes to the same files, so no reader may
// start before the last journal is settled.
func serveAdopted(a spawnArgs, took []adoption) {
	for _, ad := range took {
		for _, p := range []struct {
			j    *logs.Journal
			sink *logs.Sink
		}{{ad.c.outJ, a.out}, {ad.c.errJ, a.err}} {
			if p.j == nil {
				continue
			}
			if err := p.j.Settle(p.sink); err != nil && a.log != nil {
				a.log.Warn("cannot settle a journal of an adopted worker", "pid", ad.w.PID, "error", err)
			}
		}
	}
	for _, ad := range took {
		ad.w.serve(a, ad.spec, ad.c, ad.pending)
	}
}

// adoptWorker makes a Worker of a process a previous agent started, after
// checking through a pidfd that it is still that process; serveAdopted
// starts its goroutines. On error h's files are closed.
func adoptWorker(a spawnArgs, spec *Spec, h *Handover) (*Worker, *channels, error) {
	pfd, err := handoff.OpenPidfd(h.PID, h.StartTime)
	if err != nil {
		h.closeFiles(true)
		return nil, nil, err
	}
	nf, out, errR := h.files["notify"], h.files["out"], h.files["err"]
	if nf == nil || out == nil || errR == nil {
		pfd.Close()
		h.closeFiles(true)
		return nil, nil, fmt.Errorf("pid %d: its notify socket or output pipes did not cross", h.PID)
	}
	notify, err := handoff.NotifyFromFile(nf)
	nf.Close()
	if err != nil {
		pfd.Close()
		h.closeFiles(true)
		return nil, nil, err
	}
	c := &channels{notify: notify, outR: out, errR: errR}
	c.adoptJournals(a, h)
	if addr := handoff.HealthAddr(notify.Addr()); spec.wantsHealthSocket() && handoff.HealthPresent(addr) {
		c.healthAddr = addr
	}
	if f := h.files["ipc"]; f != nil {
		c.ipc = &handoff.IPCChannel{Parent: f}
	}
	w := &Worker{
		Slot: h.Slot, PID: h.PID, Release: h.Release, Generation: h.Generation, Started: h.Started,
		spec: spec, pidfd: pfd, startTime: h.StartTime, tail: logs.NewTail(tailLines),
		ready: make(chan struct{}), exited: make(chan struct{}), state: Starting, status: h.Status, kept: h.Kept,
		// The watchdog counts from the adoption: the handoff paused the
		// reading of its WATCHDOG=1 messages.
		watchdog: time.Now(),
	}
	if !h.ReadyAt.IsZero() {
		w.state, w.readyAt = Ready, h.ReadyAt
		w.readyOnce.Do(func() { close(w.ready) })
	}
	sourceOf(spec).adopt(a, h, w, c)
	w.members = adoptMembers(spec, h)
	w.sockets = memberInodes(w.members) // nil for one already steered: found in /proc
	if h.Unit != nil {
		w.unit = procunit.Reopen(*h.Unit)
	}
	return w, c, nil
}

// adoptJournals takes the journals that crossed with h (logs.OpenJournal);
// a worker whose journals did not cross (started by an agent without them)
// gets new ones, which it does not keep: after a crash its last lines may
// be lost, as before.
func (c *channels) adoptJournals(a spawnArgs, h *Handover) {
	fo, fe := h.files["outj"], h.files["errj"]
	if fo == nil || fe == nil {
		closeFiles(fo, fe)
		c.openJournals(a)
		return
	}
	var err error
	for _, p := range []struct {
		f *os.File
		j **logs.Journal
	}{{fo, &c.outJ}, {fe, &c.errJ}} {
		var jerr error
		if *p.j, jerr = logs.OpenJournal(p.f); *p.j == nil {
			p.f.Close()
		}
		err = errors.Join(err, jerr)
	}
	if err != nil && a.log != nil {
		a.log.Warn("a journal of an adopted worker was unreadable: what it held is lost", "pid", h.PID, "error", err)
	}
	if c.outJ == nil || c.errJ == nil {
		c.closeJournals()
		c.openJournals(a)
	}
}
