package workers

import (
	"sync"

	"github.com/prometheus/procfs"

	"github.com/deployd/deployd/handoff"
)

// Registry maps the pids of live workers of every app to their Worker, so a
// sd_notify message can be attributed to the worker that sent it, or whose
// child sent it. Safe for concurrent use.
type Registry struct {
	mu    sync.Mutex
	byPID map[int]*Worker
	fs    procfs.FS
}

// NewRegistry returns an empty registry reading /proc.
func NewRegistry() *Registry {
	fs, _ := procfs.NewDefaultFS()
	return &Registry{byPID: map[int]*Worker{}, fs: fs}
}

func (r *Registry) add(w *Worker) {
	r.mu.Lock()
	r.byPID[w.PID] = w
	r.mu.Unlock()
}

func (r *Registry) remove(w *Worker) {
	r.mu.Lock()
	if r.byPID[w.PID] == w {
		delete(r.byPID, w.PID)
	}
	r.mu.Unlock()
}

func (r *Registry) get(pid int) *Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byPID[pid]
}

// Lookup finds the worker pid belongs to: the worker itself, a process in
// its process group, or a descendant (up to 16 generations).
func (r *Registry) Lookup(pid int) *Worker {
	if w := r.get(pid); w != nil {
		return w
	}
	for i := 0; i < 16 && pid > 1; i++ {
		p, err := r.fs.Proc(pid)
		if err != nil {
			return nil
		}
		st, err := p.Stat()
		if err != nil {
			return nil
		}
		if w := r.get(st.PGRP); w != nil {
			return w
		}
		if w := r.get(st.PPID); w != nil {
			return w
		}
		pid = st.PPID
	}
	return nil
}

// HandleNotify attributes an sd_notify message to its worker; messages from
// unknown processes are ignored. Use as handoff.NotifySocket.Serve's callback.
func (r *Registry) HandleNotify(pid int, msg handoff.Notify) {
	if w := r.Lookup(pid); w != nil {
		w.onNotify(msg)
	}
}
