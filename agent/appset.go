package agent

import (
	"sort"
	"sync"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// appSet is the agent's apps by name, and the one owner of that map. Its
// lock is taken only in the leaf methods below, which call nothing that may
// lock (no method of an app, no callback, no I/O): no caller can hold it
// while taking it again. A config change goes one way through it: the new
// apps are built outside, then swap adds them and takes out the apps that
// left in one step, and the caller stops those (reload.go).
// locks_test.go checks that every lock of the package is taken in such a
// leaf.
type appSet struct {
	mu   sync.Mutex
	apps map[string]*appRT
}

// get returns the app named name, nil when the agent does not run it.
func (s *appSet) get(name string) *appRT {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apps[name]
}

// list returns the apps sorted by name.
func (s *appSet) list() []*appRT {
	s.mu.Lock()
	rts := make([]*appRT, 0, len(s.apps))
	for _, rt := range s.apps {
		rts = append(rts, rt)
	}
	s.mu.Unlock()
	sort.Slice(rts, func(i, j int) bool { return rts[i].name < rts[j].name })
	return rts
}

// swap adds the apps of add whose name is free, and takes out the apps
// named in remove. It returns the apps it did not add (a concurrent reload
// added one of that name first) and those it took out.
func (s *appSet) swap(add []*appRT, remove []string) (taken, removed []*appRT) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apps == nil {
		s.apps = map[string]*appRT{}
	}
	for _, rt := range add {
		if s.apps[rt.name] != nil {
			taken = append(taken, rt)
			continue
		}
		s.apps[rt.name] = rt
	}
	for _, n := range remove {
		if rt := s.apps[n]; rt != nil {
			removed = append(removed, rt)
			delete(s.apps, n)
		}
	}
	return taken, removed
}

// processes returns the worker processes of apps, by app name.
func processes(apps []*appRT) map[string][]workers.Process {
	out := map[string][]workers.Process{}
	for _, rt := range apps {
		if ps := rt.sup.Processes(); len(ps) > 0 {
			withLearned(ps, rt.running().Learned())
			out[rt.name] = ps
		}
	}
	return out
}

// withLearned adds to each process's listeners those its app learned from
// its binds (learn.go): the workers hold them at fds of their own, and the
// agent after a crash takes them back from one (survivors.sockets) as it
// takes the others.
func withLearned(ps []workers.Process, learned []handoff.Bound) {
	for i := range ps {
		for _, b := range learned {
			ps[i].Listen = append(ps[i].Listen, workers.Listen{Network: b.Network, Address: b.Address})
		}
	}
}
