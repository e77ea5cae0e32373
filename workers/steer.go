package workers

import (
	"fmt"
	"slices"
	"strconv"
	"time"

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
//   - a blue-green reload keeps its new workers out of the map, ready like
//     spares, until all are; then it puts them in the map's standby half
//     and makes that half live in one update (cutover), so that every
//     position changes at the same moment;
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
			if n, ok := countAt(gs, p); ok {
				st.connBase[w] = n
			} else {
				delete(st.connBase, w) // unknown rather than counted from a wrong base
			}
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

// countAt sums the connections the groups gave to position p; ok is
// false when there is no group or a count cannot be read.
func countAt(gs []*steer.Group, p int) (n uint64, ok bool) {
	for _, g := range gs {
		c, err := g.Count(p)
		if err != nil {
			return 0, false
		}
		n += c
	}
	return n, len(gs) > 0
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
	n, ok = countAt(steeredGroups(st.spec), p)
	if !ok || n < base { // not steered any more, or not the count the base was taken from
		return 0, false
	}
	return n - base, true
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

// cut is a cutover done: its event, and the connection count of each new
// worker's position at that moment (connBase, set once they are current).
type cut struct {
	event Event
	base  map[*Worker]uint64
}

// cutover switches the new workers of a blue-green group in at once: for
// each steered listener, the own socket of every new worker whose slot has
// a position goes to that position in the map's standby half, then one
// update makes that half live (steer.Group.Flip), before any old worker is
// told to stop. The old workers' sockets stay in the other half, taking no
// new connection, until they close and the kernel moves their queues over.
// It returns nil when the pool is not steered or the group cannot be
// switched at once: then each new worker takes its position as its slot
// changes (steerPool), and the agent log says why. Run by the loop, just
// before the group's slots change.
func (s *Supervisor) cutover(st *state, group []*slot, news []*Worker, release string) *cut {
	gs := steeredGroups(st.spec)
	if len(gs) == 0 {
		return nil
	}
	staged := map[*Worker]int{}
	for k, sl := range group {
		if p, ok := st.pos[sl]; ok {
			staged[news[k]] = p
		}
	}
	if why := cutoverBlocked(st, group, staged, gs); why != "" {
		s.log.Info("blue-green: the new workers take their positions one by one", "why", why)
		// No cutover: the reload's progress says so, and why.
		return &cut{base: map[*Worker]uint64{}, event: s.changeStateTo(st, Event{Type: EventNotice, Release: release,
			Message: "blue-green without a cutover at once: the new workers take their positions one by one: " + why}, nil)}
	}
	at := time.Now() // before the update: no connection reached a new worker earlier
	switched := false
	for _, g := range gs {
		switched = s.flipIn(g, staged, st.steerActive) || switched
	}
	if !switched {
		return nil
	}
	c := &cut{base: map[*Worker]uint64{}}
	for w, p := range staged {
		if n, ok := countAt(gs, p); ok {
			c.base[w] = n
		}
	}
	c.event = s.changeStateTo(st, Event{Type: EventCutover, Time: at, Release: release,
		Message: fmt.Sprintf("%d new workers took every position at once", len(staged))}, nil)
	return c
}

// cutoverBlocked says why the group cannot be switched in at once, "" if
// it can: every position must belong to a slot of group (or to one the
// reload removes), and every new worker placed must still hold its own
// sockets.
func cutoverBlocked(st *state, group []*slot, staged map[*Worker]int, gs []*steer.Group) string {
	for _, g := range gs {
		if !g.CanFlip() {
			return steer.ErrNoStandby.Error()
		}
	}
	for sl := range st.pos {
		if !slices.Contains(group, sl) && sl.index < st.spec.Instances {
			return fmt.Sprintf("worker %d keeps its place through this switch (a canary's batch, or the promote after one)", sl.index)
		}
	}
	for w := range staged {
		if !w.hasMembers() {
			return fmt.Sprintf("the new worker %d (pid %d) holds no socket of its own", w.Slot, w.PID)
		}
	}
	return ""
}

// flipIn stages the own socket of g of every worker of staged at its
// position, then makes the standby half live, and closes the agent's
// copies of those sockets. The standby half's other active positions are
// emptied first: a worker of two generations ago may not have closed its
// socket yet. On error it unstages them and keeps the copies (steerPool
// then puts the workers in one by one), and reports false.
func (s *Supervisor) flipIn(g *steer.Group, staged map[*Worker]int, active int) bool {
	if err := s.switchHalves(g, staged, active); err != nil {
		s.log.Error("steering: cannot switch the new workers in at once; they take their positions one by one", "error", err)
		return false
	}
	for w := range staged {
		closeMembers(w.takeMembersOf(g))
	}
	return true
}

// switchHalves stages the sockets of staged in the standby half and makes
// it live, keeping the agent's copies of the sockets. On error the
// standby half is left without them.
func (s *Supervisor) switchHalves(g *steer.Group, staged map[*Worker]int, active int) error {
	taken := map[int]bool{}
	for _, p := range staged {
		taken[p] = true
	}
	for p := range active {
		if !taken[p] {
			if err := g.Unstage(p); err != nil {
				s.log.Error("steering: cannot empty a standby position", "worker", p, "error", err)
			}
		}
	}
	var done []int
	for w, p := range staged {
		if err := w.stage(g, p); err != nil {
			unstage(g, done)
			return fmt.Errorf("stage worker %d (pid %d): %w", w.Slot, w.PID, err)
		}
		done = append(done, p)
	}
	if err := g.Flip(); err != nil {
		unstage(g, done)
		return err
	}
	return nil
}

func unstage(g *steer.Group, positions []int) {
	for _, p := range positions {
		g.Unstage(p)
	}
}

// stage puts w's own socket of g at position p of g's standby half.
func (w *Worker) stage(g *steer.Group, p int) error {
	w.mu.Lock()
	i := slices.IndexFunc(w.members, func(m member) bool { return m.group == g })
	var m member
	if i >= 0 {
		m = w.members[i] // closed only by the loop, which runs this
	}
	w.mu.Unlock()
	if i < 0 {
		return fmt.Errorf("worker %d holds no socket of its own for this listener", w.Slot)
	}
	fd, err := m.sock.Fd()
	if err != nil {
		return err
	}
	return g.Stage(p, fd)
}

// takeMembersOf is takeMembers for g's socket alone.
func (w *Worker) takeMembersOf(g *steer.Group) []member {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []member
	w.members = slices.DeleteFunc(w.members, func(m member) bool {
		if m.group == g {
			out = append(out, m)
			return true
		}
		return false
	})
	return out
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
	if p, placed := st.pos[sl]; !placed || ps.Position == nil || p != *ps.Position || ps.ConnBase == nil || sl.cur == nil {
		return // the base is the count of the place the worker had
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
