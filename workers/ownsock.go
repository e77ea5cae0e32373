package workers

import (
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/handoff/bindtrap"
	"github.com/deployd/deployd/internal/sockdiag"
)

// A worker whose bind the agent answers gets a socket of its own where
// the listener can steer: one the registry opened for balance "auto" (the
// default of an app whose binds are answered; handoff/steerbind.go), or
// "even"/"sticky" for a worker that got the listener itself (adopted
// before it bound). Its first such bind turns an auto listener's steering
// on, and from then on the app's pool is steered: each new worker gets a
// socket of its own at its start (workerListeners), the old ones are taken
// out of the rotation and quieted before their stop signal (quiet.go). An
// app that takes fd 3 never binds, and keeps the one shared socket.

// ownBind is a socket of its own that a bind of w is answered with: placed
// then kept as w's member until it is in the steering map, or closed when
// it could not be placed. Its methods are safe on nil (a bind answered
// with the listener itself).
type ownBind struct {
	w      *Worker
	anchor *handoff.Listener
	m      member
	log    hclog.Logger
}

// ownSocket puts in d, which answers a bind of w with a listener, a new
// socket of that listener's reuseport group, and returns it; nil where the
// listener has no group (shared), or d's socket is w's own already (from
// workerListeners), or the group cannot give one (d keeps the listener).
func (w *Worker) ownSocket(d *bindtrap.Decision, log hclog.Logger) *ownBind {
	l, ok := d.Sock.(*handoff.Listener)
	if !ok {
		return nil
	}
	st := l.Steerable()
	if st == nil {
		return nil
	}
	m, err := l.Member()
	if err != nil {
		log.Warn("the bind is answered with the shared socket: no socket of its own", "listen", d.Name, "error", err)
		return nil
	}
	o := &ownBind{w: w, anchor: l, m: member{group: st.Group, sock: m}, log: log}
	d.Sock, d.Unused = m, func() { m.Close() }
	return o
}

// placed makes the socket w's: a member until the supervisor puts it in
// w's place of the steering map (at once when w is ready already: a bind
// made again), and the first one of an auto listener turns its steering
// on. It replaces (and closes the agent's copy of) a member of the same
// group that w's binds got before and the map does not have yet: the
// agent holds one socket per worker and listener however often an app
// binds. Called from the trap's goroutine, which ends before w's members
// are closed at its exit (finish).
func (o *ownBind) placed() {
	if o == nil {
		return
	}
	var old []member
	o.w.mu.Lock()
	o.w.members = slices.DeleteFunc(o.w.members, func(m member) bool {
		if m.group == o.m.group {
			old = append(old, m)
			return true
		}
		return false
	})
	o.w.members = append(o.w.members, o.m)
	o.w.mu.Unlock()
	closeMembers(old)
	if o.anchor.SteerOnBind() {
		o.log.Info("the worker bound its listen address itself: each worker gets a socket of its own from now on",
			"listen", o.anchor.Network+" "+o.anchor.Address)
	}
	if o.w.isReady() && o.w.steerReady != nil {
		o.w.steerReady(o.w)
	}
}

// steerable reports whether spec has a listener that steers, or will once
// a worker binds its address (an auto listener).
func steerable(spec *Spec) bool {
	for _, b := range spec.Listeners {
		if b.Steerable() != nil {
			return true
		}
	}
	return false
}

// holdsOwnListener reports whether the process pid holds a listening
// socket on a port of spec's listeners other than the listeners' own: a
// socket of its own, which an earlier agent answered one of its binds
// with (read from the kernel at adoption, for status).
func holdsOwnListener(pid int, spec *Spec) bool {
	held, err := sockdiag.Inodes(pid)
	if err != nil {
		return false
	}
	ports, shared := listenerPorts(spec), listenerInodes(spec)
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(s *sockdiag.Socket) bool {
		return ports[s.Local.Port()] && held[s.Inode] && !shared[s.Inode]
	})
	return err == nil && len(socks) > 0
}
