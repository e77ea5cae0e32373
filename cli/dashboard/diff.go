package dashboard

import (
	"fmt"

	"github.com/deployd/deployd/agent/api"
)

// Event is one entry of the timeline. Kind is one of: agent, app, state,
// release, canary, started, ready, draining, exited, crash, restart,
// errored.
type Event struct {
	T    int64  `json:"t"` // Unix milliseconds
	App  string `json:"app,omitempty"`
	Kind string `json:"kind"`
	Slot int    `json:"slot"` // -1: not about one worker
	PID  int    `json:"pid,omitempty"`
	Text string `json:"text"`
}

// diffStatus derives the timeline entries between two polls of the
// agent's status (the control API has no event feed to follow). prev nil
// is the first poll: nothing happened yet. Changes that came and went
// between two polls are not seen, but a restart is still told by the
// slot's restart count.
func diffStatus(prev, cur *api.Status, now int64) []Event {
	if prev == nil || cur == nil {
		return nil
	}
	var evs []Event
	add := func(app, kind string, slot, pid int, format string, args ...any) {
		evs = append(evs, Event{T: now, App: app, Kind: kind, Slot: slot, PID: pid, Text: fmt.Sprintf(format, args...)})
	}
	if prev.Agent.PID != cur.Agent.PID {
		add("", "agent", -1, cur.Agent.PID, "agent pid %d (%s) took over from pid %d", cur.Agent.PID, cur.Agent.Version, prev.Agent.PID)
	}
	old := map[string]api.App{}
	for _, a := range prev.Apps {
		old[a.Name] = a
	}
	for _, a := range cur.Apps {
		p, ok := old[a.Name]
		delete(old, a.Name)
		if !ok {
			add(a.Name, "app", -1, 0, "app added (%s, %d workers)", a.State, a.Instances)
			continue
		}
		evs = append(evs, diffApp(p, a, now)...)
	}
	for name := range old {
		add(name, "app", -1, 0, "app removed")
	}
	return evs
}

// diffApp derives the entries of one app: its state, release and canary,
// then its workers.
func diffApp(p, a api.App, now int64) []Event {
	var evs []Event
	add := func(kind string, slot, pid int, format string, args ...any) {
		evs = append(evs, Event{T: now, App: a.Name, Kind: kind, Slot: slot, PID: pid, Text: fmt.Sprintf(format, args...)})
	}
	if p.State != a.State {
		kind := "state"
		if a.State == "errored" {
			kind = "errored"
		}
		add(kind, -1, 0, "%s → %s", p.State, a.State)
	}
	if p.Release != a.Release && a.Release != "" {
		add("release", -1, 0, "release %s → %s", orNone(p.Release), a.Release)
	}
	switch {
	case p.Canary == nil && a.Canary != nil:
		add("canary", -1, 0, "canary %s held on slots %v beside %s", a.Canary.Release, a.Canary.Slots, orNone(a.Canary.Previous))
	case p.Canary != nil && a.Canary == nil && a.LastCanary != nil:
		add("canary", -1, 0, "canary %s %s by %s", a.LastCanary.Release, a.LastCanary.Outcome, a.LastCanary.By)
	}
	return append(evs, diffWorkers(p, a, now)...)
}

// diffWorkers derives the entries of an app's workers: gone, new, changed.
func diffWorkers(p, a api.App, now int64) []Event {
	var evs []Event
	add := func(kind string, slot, pid int, format string, args ...any) {
		evs = append(evs, Event{T: now, App: a.Name, Kind: kind, Slot: slot, PID: pid, Text: fmt.Sprintf(format, args...)})
	}
	before := map[int]api.Worker{}
	slotRestarts := map[int]int{}
	for _, w := range p.Workers {
		before[w.PID] = w
		slotRestarts[w.Slot] = max(slotRestarts[w.Slot], w.Restarts)
	}
	alive := map[int]bool{}
	for _, w := range a.Workers {
		alive[w.PID] = true
	}
	// A worker that left between two polls while it served crashed if the
	// app counted a restart or a new exit; else a reload or scale
	// stopped it.
	crashed := a.Restarts > p.Restarts || a.LastExit != p.LastExit
	// Workers gone first: a crash is told before its slot's restart.
	for _, w := range p.Workers {
		if w.PID == 0 || alive[w.PID] {
			continue
		}
		switch {
		case w.State == "draining" || w.State == "stopping" || w.State == "exited" || !crashed:
			add("exited", w.Slot, w.PID, "pid %d exited (slot %d)", w.PID, w.Slot)
		default:
			add("crash", w.Slot, w.PID, "pid %d in slot %d exited while %s%s", w.PID, w.Slot, w.State, lastExit(a))
		}
	}
	for _, w := range a.Workers {
		b, ok := before[w.PID]
		switch {
		case w.PID == 0:
		case !ok && w.Restarts > slotRestarts[w.Slot] && len(p.Workers) > 0:
			add("restart", w.Slot, w.PID, "slot %d restarted: pid %d (restart %d)", w.Slot, w.PID, w.Restarts)
		case !ok:
			add("started", w.Slot, w.PID, "pid %d started in slot %d (%s)", w.PID, w.Slot, orNone(w.Release))
		case b.State != w.State && w.State == "exited":
			add("crash", w.Slot, w.PID, "pid %d in slot %d exited%s", w.PID, w.Slot, lastExit(a))
		case b.State != w.State:
			add(w.State, w.Slot, w.PID, "pid %d %s (slot %d)", w.PID, w.State, w.Slot)
		}
	}
	return evs
}

func lastExit(a api.App) string {
	if a.LastExit == "" {
		return ""
	}
	return ": " + a.LastExit
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
