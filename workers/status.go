package workers

import (
	"slices"
	"sort"
	"time"
)

// WorkerStatus is a snapshot of one worker.
type WorkerStatus struct {
	Slot       int
	PID        int
	State      State
	Release    string
	Generation int
	Restarts   int
	// Replacements by max_memory, the watchdog and the health check.
	MemoryReplacements, WatchdogReplacements, HealthReplacements int
	// HealthFailures is the current run of failed liveness checks,
	// HealthFailuresTotal all of them, HealthError the last failure ("" when
	// the last check passed).
	HealthFailures, HealthFailuresTotal int
	HealthError                         string
	Uptime                              time.Duration
	ReadyAfter                          time.Duration
	// CPUPercent and RSSBytes are the last tick's sample (sampleInterval).
	CPUPercent float64
	RSSBytes   int64
	Status     string // last sd_notify STATUS=
	// RecycleIn is how long until recycle_after or recycle_at replaces
	// the worker (0 when due, or when both are off: see Recycles).
	RecycleIn time.Duration
	Recycles  bool
	RecycleBy string // "recycle_after" or "recycle_at"
	// Spare: the worker is ready but gets no connection until it takes
	// the place of one that is not (Spec.Spares), or, a new worker of a
	// steered pool, until its reload switches it in.
	Spare bool
	// Socket says how the worker got its listeners: "inherited fd",
	// "node preload" or "answered bind (...)" (bindtrap.go).
	Socket string
	// SteeredConnections counts the new connections kernel steering gave
	// the worker since it took its place (Steered false: not counted).
	SteeredConnections uint64
	Steered            bool
	// Queued counts the connections waiting in the worker's own sockets'
	// accept queues (steered listeners) at the last tick (QueueKnown
	// false: a shared pool, or not known).
	Queued     int
	QueueKnown bool
	// Connections, of a draining worker only, counts the established TCP
	// connections on its app's listeners that it still holds; nil where
	// that is not known (see openConnections).
	Connections *int
}

// AppStatus is a snapshot of an app's pool.
type AppStatus struct {
	State     AppState
	Release   string
	Instances int
	// Balance is how new connections reach the workers: "shared", "even"
	// or "sticky" (kernel steering; see steer.go).
	Balance string
	// Paused is the connection pause, nil when none (connpause.go).
	Paused *PauseStatus
	// Spares is how many of the workers are spares (not counted in
	// Instances).
	Spares int
	// Workers are the slots' workers (current ones, and new ones being
	// started, or ones being stopped, beside them).
	Workers []WorkerStatus
	// Draining are old workers an operation replaced, draining in the
	// background (state draining) until they exit or stop_timeout passes;
	// they belong to no slot any more (Slot is the one they served).
	Draining  []WorkerStatus
	Restarts  int
	LastExit  string
	LastLines []string
	// Warnings are accept queues that grow while no worker accepts.
	Warnings []string
	// AcceptQueues are the TCP listeners' accept queues at the last tick
	// (acceptq.go).
	AcceptQueues []ListenerQueue
	// Busy is the operation that runs, nil when none.
	Busy *BusyError
	// Canary is the held canary, nil when none; LastCanary says how the
	// last one ended, until the next operation.
	Canary     *CanaryStatus
	LastCanary *CanaryEnd
}

// Status returns a snapshot, workers sorted by slot then start time. It
// changes nothing: CPU and memory are the last tick's sample; the open
// connections of draining workers are counted now, outside the loop.
func (s *Supervisor) Status() AppStatus {
	var st AppStatus
	var draining []*Worker
	s.read(func(in *state) { st, draining = in.status(s.opts.App), in.drainingWorkers() })
	openConnections(st.Draining, draining)
	return st
}

func (in *state) status(app string) AppStatus {
	spares := in.spares()
	st := AppStatus{State: in.app, Release: in.spec.Release, Instances: max(len(in.slots)-spares, 0), Balance: in.spec.Balance(),
		Paused: in.connPause.status(), Spares: spares,
		LastExit: in.lastExit, LastLines: slices.Clone(in.lastLines), Warnings: in.queueWarnings(),
		AcceptQueues: in.listenerQueues()}
	if in.op != nil {
		st.Busy = in.op.busy(app)
	}
	if in.hold != nil {
		st.Canary = in.hold.status()
	}
	if in.lastHold != nil {
		last := *in.lastHold
		st.LastCanary = &last
	}
	now := time.Now()
	for _, sl := range in.slots {
		st.Restarts += sl.restarts
		if sl.cur != nil {
			ws := in.workerStatus(sl.cur, now)
			ws.Restarts, ws.MemoryReplacements, ws.WatchdogReplacements, ws.HealthReplacements =
				sl.restarts, sl.memoryReplacements, sl.watchdogReplacements, sl.healthReplacements
			if _, placed := in.pos[sl]; spares > 0 && !placed {
				ws.Spare = true
			}
			ws.SteeredConnections, ws.Steered = in.connections(sl)
			if sl.spec != nil {
				if at, by := recycleAt(sl.spec, sl.cur); !at.IsZero() {
					ws.Recycles, ws.RecycleIn, ws.RecycleBy = true, max(at.Sub(now), 0), by
				}
			}
			st.Workers = append(st.Workers, ws)
		}
		for _, w := range sl.extra {
			ws := in.workerStatus(w, now)
			// A new worker of a steered pool is out of the map until it
			// takes its slot: ready, it waits like a spare.
			ws.Spare = ws.State == Ready && w.hasMembers()
			st.Workers = append(st.Workers, ws)
		}
	}
	for _, w := range in.drainingWorkers() {
		st.Draining = append(st.Draining, in.workerStatus(w, now))
	}
	sort.SliceStable(st.Workers, func(i, j int) bool { return st.Workers[i].Slot < st.Workers[j].Slot })
	return st
}

func (in *state) workerStatus(w *Worker, now time.Time) WorkerStatus {
	u := in.usage[w].usage
	queued, known := in.workerQueue(w)
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := WorkerStatus{Slot: w.Slot, PID: w.PID, State: w.state, Release: w.Release,
		Generation: w.Generation, Uptime: now.Sub(w.Started),
		CPUPercent: u.CPUPercent, RSSBytes: u.RSSBytes, Status: w.status,
		HealthFailures: w.health.fails, HealthFailuresTotal: w.health.total, HealthError: w.health.last,
		Queued: queued, QueueKnown: known, Socket: w.socketSource()}
	if !w.readyAt.IsZero() {
		ws.ReadyAfter = w.readyAt.Sub(w.Started)
	}
	return ws
}
