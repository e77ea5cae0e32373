package workers

import (
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
	// Replacements by max_memory and the watchdog.
	MemoryReplacements, WatchdogReplacements int
	Uptime                                   time.Duration
	ReadyAfter                               time.Duration
	CPUPercent                               float64
	RSSBytes                                 int64
	Status                                   string // last sd_notify STATUS=
}

// AppStatus is a snapshot of an app's pool.
type AppStatus struct {
	State     AppState
	Release   string
	Instances int
	Workers   []WorkerStatus
	Restarts  int
	LastExit  string
	LastLines []string
}

// Status returns a snapshot, workers sorted by slot then start time.
func (s *Supervisor) Status() AppStatus {
	s.mu.Lock()
	st := AppStatus{State: s.state, Release: s.spec.Release, Instances: len(s.slots),
		LastExit: s.lastExit, LastLines: s.lastLines}
	type entry struct {
		w                       *Worker
		restarts, memory, watch int
	}
	var ws []entry
	for _, sl := range s.slots {
		st.Restarts += sl.restarts
		if sl.cur != nil {
			ws = append(ws, entry{sl.cur, sl.restarts, sl.memoryReplacements, sl.watchdogReplacements})
		}
		for _, w := range sl.extra {
			ws = append(ws, entry{w: w})
		}
	}
	s.mu.Unlock()
	now := time.Now()
	for _, e := range ws {
		w := e.w
		u := w.usage(s.fs)
		w.mu.Lock()
		ws := WorkerStatus{Slot: w.Slot, PID: w.PID, State: w.state, Release: w.Release,
			Generation: w.Generation, Restarts: e.restarts, Uptime: now.Sub(w.Started),
			MemoryReplacements: e.memory, WatchdogReplacements: e.watch,
			CPUPercent: u.CPUPercent, RSSBytes: u.RSSBytes, Status: w.status}
		if !w.readyAt.IsZero() {
			ws.ReadyAfter = w.readyAt.Sub(w.Started)
		}
		w.mu.Unlock()
		st.Workers = append(st.Workers, ws)
	}
	sort.SliceStable(st.Workers, func(i, j int) bool { return st.Workers[i].Slot < st.Workers[j].Slot })
	return st
}
