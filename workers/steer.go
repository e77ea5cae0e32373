package workers

import (
	"slices"
	"strconv"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/steer"
)

// Kernel steering (balance = "even" or "sticky"): each worker listens on a
// socket of its own in the address's reuseport group, and the kernel gives
// a new connection to the socket that the group's program picks from a
// map of slot → socket. The supervisor keeps that map in step with the
// pool, from the one door every state change goes through (steerPool):
//
//   - a slot's current worker is put in the map once it is ready: a reload
//     replaces the old worker's socket in one map update, before the old
//     worker is told to stop, so the old one gets no new connection;
//   - slots past the pool's size are emptied before their workers drain;
//   - a socket that closes (its worker drained, stopped or crashed) leaves
//     the map by itself, and the kernel hands its queued connections to
//     another socket (request migration) instead of resetting them.
//
// The agent holds its copy of a worker's socket only until the worker is
// in the map: from then on the worker's own close is what the kernel acts on.

// member is a worker's own socket for one steered listener.
type member struct {
	group *steer.Group
	sock  *handoff.Listener
}

// workerListeners returns the listeners a new worker gets: the spec's,
// with a socket of its own in place of each steered one, and those
// sockets. On error none stays open.
func workerListeners(spec *Spec) ([]handoff.Bound, []member, error) {
	ls := make([]handoff.Bound, 0, len(spec.Listeners))
	var ms []member
	for _, b := range spec.Listeners {
		st := b.Steered()
		if st == nil {
			ls = append(ls, b)
			continue
		}
		m, err := b.Member()
		if err != nil {
			closeMembers(ms)
			return nil, nil, err
		}
		ms = append(ms, member{group: st.Group, sock: m})
		ls = append(ls, handoff.Bound{Listener: m, Name: b.Name})
	}
	return ls, ms, nil
}

func closeMembers(ms []member) {
	for _, m := range ms {
		m.sock.Close()
	}
}

// takeMembers hands over the agent's copies of w's own sockets (nil once
// taken): to steerIn, or to be closed when w ends.
func (w *Worker) takeMembers() []member {
	w.mu.Lock()
	defer w.mu.Unlock()
	ms := w.members
	w.members = nil
	return ms
}

// Balance says how the spec's TCP listeners spread connections: "shared"
// (one socket all workers accept on), "even" or "sticky". A steered
// setting the kernel could not give is "shared" (the agent log says why).
func (spec *Spec) Balance() string {
	for _, b := range spec.Listeners {
		if b.Steered() != nil {
			return b.Balance()
		}
	}
	return handoff.BalanceShared
}

// steeredGroups are the steering programs of spec's listeners.
func steeredGroups(spec *Spec) []*steer.Group {
	var gs []*steer.Group
	for _, b := range spec.Listeners {
		if st := b.Steered(); st != nil {
			gs = append(gs, st.Group)
		}
	}
	return gs
}

// steerPool brings the kernel's map in step with the pool: each of the
// first Instances-Spares map positions belongs to a slot, whose ready
// current worker is put there; the other slots are spares, ready but in no
// position. A position whose worker exited passes to a ready spare at
// once (a crash: the map changes, nothing starts; the crashed
// slot's restart becomes the new spare). Positions past the active count
// are emptied before their workers drain. Run by the loop, from
// changeStateTo.
func (s *Supervisor) steerPool(st *state) { s.steerPoolWith(st, nil) }

// steerReady puts w in its place as it gets ready, before its state says
// ready: whoever sees it ready can reach it. Called from w's reader (its
// markReady), through the loop.
func (s *Supervisor) steerReady(w *Worker) {
	s.call(func(st *state) { s.steerPoolWith(st, w) })
}

// steerPoolWith is steerPool, with ready counting as ready already.
func (s *Supervisor) steerPoolWith(st *state, ready *Worker) {
	gs := steeredGroups(st.spec)
	if len(gs) == 0 {
		return
	}
	active := max(min(st.spec.Instances, len(st.slots))-st.spares(), 0)
	if active != st.steerActive {
		for _, g := range gs {
			if err := g.SetActive(active); err != nil {
				s.log.Error("steering: cannot set the pool size", "error", err)
			}
			for i := active; i < st.steerActive; i++ {
				if err := g.Clear(i); err != nil {
					s.log.Error("steering: cannot empty a slot", "worker", i, "error", err)
				}
			}
		}
		st.steerActive = active
	}
	s.placeSlots(st, active, ready)
	for w := range st.connBase { // workers no slot has any more
		if !slices.ContainsFunc(st.slots, func(sl *slot) bool { return sl.cur == w }) {
			delete(st.connBase, w)
		}
	}
	for sl, p := range st.pos {
		w := sl.cur
		if st.handover != nil && st.handover.workers[w] {
			continue // its own sockets cross to the next agent, which steers it in
		}
		if w != nil && (w.isReady() || w == ready) && w.hasMembers() {
			if st.connBase == nil {
				st.connBase = map[*Worker]uint64{}
			}
			st.connBase[w] = countAt(gs, p)
			s.steerIn(p, w)
		}
	}
}

// placeSlots gives the positions 0..active-1 to slots: a slot keeps its
// own while it lives, a free one goes to a slot without one (ready ones
// first, then by index), and a position whose worker exited passes to a
// ready spare.
func (s *Supervisor) placeSlots(st *state, active int, ready *Worker) {
	readyCur := func(sl *slot) bool { return sl.cur != nil && (sl.cur == ready || readyCur(sl)) }
	if st.pos == nil {
		st.pos = map[*slot]int{}
	}
	held := make([]*slot, active)
	for sl, p := range st.pos {
		if !st.live(sl) || p >= active {
			delete(st.pos, sl)
		} else {
			held[p] = sl
		}
	}
	var spares []*slot // unplaced, ready first
	for _, ready := range []bool{true, false} {
		for _, sl := range st.slots {
			if _, ok := st.pos[sl]; !ok && readyCur(sl) == ready {
				spares = append(spares, sl)
			}
		}
	}
	for p, sl := range held {
		switch {
		case sl == nil && len(spares) > 0:
			held[p], spares = spares[0], spares[1:]
		case sl != nil && sl.cur != nil && sl.cur.State() == Exited && len(spares) > 0 && readyCur(spares[0]):
			s.log.Info("a spare takes the place of a worker that exited", "worker", sl.index, "spare", spares[0].index)
			delete(st.pos, sl)
			held[p], spares = spares[0], append(spares[1:], sl)
		}
		if held[p] != nil {
			st.pos[held[p]] = p
		}
	}
}

// spares is how many slots are spares: Spec.Spares when the pool is
// steered (a shared socket cannot keep a worker out of the rotation).
func (st *state) spares() int {
	if len(steeredGroups(st.spec)) == 0 {
		return 0
	}
	return min(st.spec.Spares, len(st.slots))
}

// readyCur reports whether sl's current worker is ready.
func readyCur(sl *slot) bool { return sl.cur != nil && sl.cur.isReady() && sl.cur.State() != Exited }

// hasMembers reports whether the agent still holds w's own sockets (it is
// not in the map yet).
func (w *Worker) hasMembers() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.members) > 0
}

// countAt sums the connections the groups gave to position p.
func countAt(gs []*steer.Group, p int) uint64 {
	var n uint64
	for _, g := range gs {
		if c, err := g.Count(p); err == nil {
			n += c
		}
	}
	return n
}

// connections is how many new connections w got since it took its
// position; ok is false for a worker in none (a spare, a shared pool, or
// one adopted in place).
func (st *state) connections(sl *slot) (n uint64, ok bool) {
	p, placed := st.pos[sl]
	base, known := st.connBase[sl.cur]
	if !placed || !known {
		return 0, false
	}
	return countAt(steeredGroups(st.spec), p) - base, true
}

// steerIn puts w's own sockets in slot (replacing the ones there), then
// closes the agent's copies. A worker already in (or adopted) has none.
func (s *Supervisor) steerIn(slot int, w *Worker) {
	ms := w.takeMembers()
	for _, m := range ms {
		fd, err := m.sock.Fd()
		if err == nil {
			err = m.group.Set(slot, fd)
		}
		if err != nil {
			s.log.Error("steering: cannot give a worker its connections", "worker", slot, "pid", w.PID, "error", err)
		}
	}
	closeMembers(ms)
}

// steerStream names a worker's i-th own socket in a Handover.
func steerStream(i int) string { return "steer" + strconv.Itoa(i) }

// adoptMembers takes the own sockets a worker of spec crossed a handoff
// with (it was not in the steering map yet); a socket without a steered
// listener to match is closed.
func adoptMembers(spec *Spec, h *Handover) []member {
	var ms []member
	i := 0
	for _, b := range spec.Listeners {
		st := b.Steered()
		if st == nil {
			continue
		}
		if f := h.files[steerStream(i)]; f != nil {
			ms = append(ms, member{group: st.Group, sock: handoff.Adopt(f, b.Network, b.Address)})
			delete(h.files, steerStream(i))
		}
		i++
	}
	for name, f := range h.files {
		if len(name) > 5 && name[:5] == "steer" {
			f.Close()
		}
	}
	return ms
}

// adoptConnBase takes over the connection count an adopted worker's place
// had when the worker took it under the previous agent, so that its
// new_connections go on counting from where they were.
func (st *state) adoptConnBase(sl *slot, ps *SlotHandover) {
	if _, placed := st.pos[sl]; !placed || ps.ConnBase == nil || sl.cur == nil {
		return
	}
	if st.connBase == nil {
		st.connBase = map[*Worker]uint64{}
	}
	st.connBase[sl.cur] = *ps.ConnBase
}

// positions gives the adopted workers' slots the places they had in the
// steering map under the previous agent, so that the map and the spares
// stay as they were; other slots get theirs from placeSlots.
func (p *PoolHandover) positions(slots []*slot, adopted map[int]*Worker) map[*slot]int {
	pos, taken := map[*slot]int{}, map[int]bool{}
	for _, ps := range p.Slots {
		if ps.Position != nil && !taken[*ps.Position] && ps.Index < len(slots) && adopted[ps.Index] != nil {
			pos[slots[ps.Index]], taken[*ps.Position] = *ps.Position, true
		}
	}
	return pos
}
