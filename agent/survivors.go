package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/boundedfile"
	"github.com/deployd/deployd/workers"
)

// Workers outlive the agent that started them (a next agent adopts them
// across a handoff), so an agent that dies without one (SIGKILL, a crash)
// leaves them running. Every agent therefore records the worker processes
// it runs in state_dir/agents/<pid>.json; an agent that starts finds the
// records of agents that are gone and adopts their survivors as an upgrade
// would have handed them over (survivors.adopt): each worker keeps copies of
// the agent's ends of its channels (handoff/keep.go), which the new agent
// copies back out of it. Those it cannot adopt (gone, pid reused, no kept
// channels, an app removed or changed) it retires once its own workers are
// ready. A clean exit removes the record.
//
// The record is written before each worker starts (recordBook.beforeStart, record.go), and a
// start it cannot write (state_dir full) is refused. Every worker also
// carries its agent's marker in its environment (DEPLOYD_AGENT_ID: this
// state_dir, the agent's pid and start time), so that an agent that starts
// also finds, in /proc, the workers of a dead agent that no record names,
// and retires them too (strays).

// survivors finds the workers that dead agents left, takes back their
// sockets, adopts those it can and retires the rest. It owns found (set
// once by find, before any app starts; adopt keeps what it could not take
// back; retireLater reads it once this agent is ready: the agent's start
// orders these calls, so no lock). It knows this agent's own workers only
// through mine, and its predecessor (an upgrade's) only through parent.
type survivors struct {
	log      hclog.Logger
	stateDir string
	// mine returns the processes this agent supervises.
	mine func() map[string][]workers.Process
	// parent is the previous agent of an upgrade; upgradeTimeout bounds
	// how long retireLater waits for it to exit (a minute more).
	parent         parentWaiter
	upgradeTimeout time.Duration

	found   []survivor // the workers dead agents left, not adopted (yet)
	records []string   // the records they came from
}

// parentWaiter is the part of the upgrader that knows the previous agent.
type parentWaiter interface {
	HasParent() bool
	WaitForParent(ctx context.Context) error
}

// survivor is a worker process that an agent which is gone left running.
type survivor struct {
	app      string
	p        workers.Process
	agentPID int
	// stray: no record named it; found by its marker (strays.go).
	stray bool
}

// collect finds the workers dead agents left (list) and keeps them, to
// adopt and retire; it returns them.
func (s *survivors) collect() []survivor {
	s.found, s.records = s.list()
	return s.found
}

// list lists the workers left by agents that are gone (their records,
// which it returns too), then the strays no record names, except those this
// agent supervises (adopted). Agents still alive (a previous agent draining
// after a handoff) keep theirs.
func (s *survivors) list() (out []survivor, records []string) {
	dir := recordsDir(s.stateDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	mine := map[int]bool{}
	for _, ps := range s.mine() {
		for _, p := range ps {
			mine[p.PID] = true
		}
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
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
				if !mine[p.PID] && !slices.ContainsFunc(out, func(o survivor) bool { return o.p.PID == p.PID }) {
					if m, ok := rec.Ready[p.PID]; ok && m.Start == p.StartTime && p.ReadyAt.IsZero() {
						p.ReadyAt = m.At
					}
					out = append(out, survivor{app: app, p: p, agentPID: rec.AgentPID})
				}
			}
		}
	}
	known := mine
	for _, sv := range out {
		known[sv.p.PID] = true
	}
	units := map[string]bool{} // of the workers known, which end what they left
	for _, ps := range s.mine() {
		for _, p := range ps {
			if p.Unit != nil {
				units[p.Unit.ID] = true
			}
		}
	}
	for _, sv := range out {
		if sv.p.Unit != nil {
			units[sv.p.Unit.ID] = true
		}
	}
	return append(out, strays(s.stateDir, known, units)...), records
}

// sockets copies the listening sockets of one live survivor per app
// (pidfd_getfd): they are still bound, so the registry adopts them as it
// adopts systemd's instead of failing to bind the address again. The
// survivors serve until this agent's workers are ready.
func (s *survivors) sockets() []*handoff.Activated {
	ss := s.found
	done := map[string]bool{}
	var out []*handoff.Activated
	for _, sv := range ss {
		if done[sv.app] || len(sv.p.Listen) == 0 {
			continue
		}
		pfd, err := handoff.OpenPidfd(sv.p.PID, sv.p.StartTime)
		if err != nil {
			continue
		}
		held, err := pfd.Listeners()
		pfd.Close()
		// Only the sockets its app listens on, each once.
		var got []*handoff.Activated
		for _, l := range held {
			if len(got) < len(sv.p.Listen) && slices.ContainsFunc(sv.p.Listen, func(w workers.Listen) bool {
				return l.Matches(w.Network, w.Address)
			}) {
				got = append(got, l)
			} else {
				l.Close()
			}
		}
		if err != nil || len(got) < len(sv.p.Listen) {
			// Exiting (a worker whose agent died gets EPIPE, often SIGPIPE,
			// at its next output line) or not holding them: try the next one,
			// and let a dying one free its address first.
			s.log.Info("no listeners to take back from a worker left by a dead agent", "app", sv.app, "pid", sv.p.PID,
				"found", len(got), "want", len(sv.p.Listen), "error", err)
			for _, l := range got {
				l.Close()
			}
			waitGone(sv.p, 2*time.Second)
			continue
		}
		done[sv.app] = true
		for _, l := range got {
			l.From = fmt.Sprintf("a worker left by a dead agent (pid %d, agent pid %d)", sv.p.PID, sv.agentPID)
		}
		out = append(out, got...)
		s.log.Info("took the listeners back from a worker left by a dead agent", "app", sv.app, "pid", sv.p.PID,
			"agent_pid", sv.agentPID, "listeners", len(got))
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

// endDead kills, before this agent binds its listeners, what the
// survivors that died while no agent ran left running (workers.EndIfGone):
// a daemon of theirs would hold the app's address.
func (s *survivors) endDead() {
	for _, sv := range s.found {
		left, err := workers.EndIfGone(sv.p)
		for _, p := range left {
			s.log.Warn("a worker left by an agent that died had exited, and left a process running; killed it",
				"app", sv.app, "worker", sv.p.Slot, "worker_pid", sv.p.PID, "pid", p.PID, "command", p.Name)
		}
		if err != nil {
			s.log.Error("a worker left by an agent that died left processes that could not be killed", "app", sv.app,
				"worker", sv.p.Slot, "worker_pid", sv.p.PID, "error", err)
		}
	}
}

// retire stops every survivor (its stop signal, stop_timeout, then SIGKILL
// to its group) and removes the records they came from.
func (s *survivors) retire(ss []survivor, records []string) {
	var wg sync.WaitGroup
	for _, sv := range ss {
		wg.Go(func() {
			left, err := workers.Retire(sv.p)
			for _, p := range left {
				s.log.Warn("a worker left by an agent that died left a process running; killed it", "app", sv.app,
					"worker", sv.p.Slot, "worker_pid", sv.p.PID, "pid", p.PID, "command", p.Name)
			}
			switch {
			case err == nil && sv.stray:
				s.log.Warn("retired a stray worker of an agent that died: no record named it (its agent died before "+
					"recording it, or could not write state_dir)", "app", sv.app, "worker", sv.p.Slot, "pid", sv.p.PID,
					"agent_pid", sv.agentPID)
			case err == nil:
				s.log.Info("retired a worker left by an agent that died", "app", sv.app, "worker", sv.p.Slot,
					"pid", sv.p.PID, "agent_pid", sv.agentPID)
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
func (s *survivors) retireLater() bool {
	if !s.parent.HasParent() {
		s.retire(s.found, s.records)
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.upgradeTimeout+time.Minute)
	err := s.parent.WaitForParent(ctx)
	cancel()
	if err != nil {
		return false
	}
	s.retire(s.list())
	return true
}

// adopt takes back (workers.TakeBack) every recorded survivor that
// still holds its channels, as the handover of an agent upgrade would have
// described it: startApps adopts them (same pids, no signal) into the apps
// whose spec they still match, and the rest are stopped once this agent
// serves. What cannot be taken back (pid gone or reused, an agent that kept
// nothing, a stray) stays in found, retired as before, and the log says why.
func (s *survivors) adopt() *received {
	r := &received{byApp: map[string][]*workers.Handover{}, pools: map[string]*workers.PoolHandover{},
		unhealthy: map[string]bool{}}
	var left []survivor
	for _, sv := range s.found {
		if sv.stray {
			left = append(left, sv)
			continue
		}
		h, err := workers.TakeBack(sv.p)
		if err != nil {
			s.log.Warn("worker left by an agent that died cannot be adopted; it will be retired", "app", sv.app,
				"worker", sv.p.Slot, "pid", sv.p.PID, "agent_pid", sv.agentPID, "error", err)
			left = append(left, sv)
			continue
		}
		s.log.Info("taking over a worker left by an agent that died", "app", sv.app, "worker", sv.p.Slot,
			"pid", sv.p.PID, "agent_pid", sv.agentPID)
		r.byApp[sv.app] = append(r.byApp[sv.app], h)
	}
	// The newest generation first: a slot's replacement rather than the
	// worker it was replacing when the agent died (the other is stopped).
	for _, hs := range r.byApp {
		slices.SortStableFunc(hs, func(x, y *workers.Handover) int { return y.Generation - x.Generation })
	}
	s.found = left
	return r
}
