package workers

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/internal/boundedfile"
	"github.com/deployd/deployd/internal/sockdiag"
)

// An old worker that an operation replaced drains in the background: the
// operation sends it its stop signal (it stops accepting) and moves on,
// so that a rolling reload over n workers with long-lived connections
// (streams, WebSockets) costs one drain at most, not n. The drain is
// bounded by the worker's stop_timeout, then its process group gets
// SIGKILL, as Worker.stop does. The worker then belongs to no slot: its
// exit, however it ends, is not a crash. Status shows it as draining until
// it is gone; Stop, Pause, Restart and Release wait for it (stopAll).

// drain is one background drain (state.draining); done is closed once the
// worker is gone and its exit published.
type drain struct {
	w    *Worker
	done chan struct{}
}

// drainAside moves w, no longer its slot's worker, to the background
// drains. Run by the loop, with the change that takes w out of its slot.
func (st *state) drainAside(w *Worker) *drain {
	d := &drain{w: w, done: make(chan struct{})}
	st.draining = append(st.draining, d)
	return d
}

// drainInBackground tells d's worker to stop and returns at once; a
// goroutine waits for the worker (killing its group at stop_timeout) and
// publishes its exit, reported to the operation's progress too while the
// operation runs.
func (o *op) drainInBackground(d *drain) {
	o.drains = append(o.drains, d)
	w := d.w
	o.step(Event{Type: EventDraining, Slot: w.Slot, PID: w.PID, Release: w.Release}, nil)
	t := time.Now()
	w.quiet(o.s.log)
	killAt := w.askStop(Draining)
	go func() {
		defer close(d.done)
		w.awaitStop(killAt, o.s.log)
		o.step(Event{Type: EventExited, Slot: w.Slot, PID: w.PID, Release: w.Release,
			Millis: time.Since(t).Milliseconds(), Message: w.stopDescription()}, func(st *state) {
			st.draining = slices.DeleteFunc(st.draining, func(x *drain) bool { return x == d })
			delete(st.usage, w)
		})
	}()
}

// drainingWorkers lists the workers draining in the background.
func (st *state) drainingWorkers() []*Worker {
	ws := make([]*Worker, 0, len(st.draining))
	for _, d := range st.draining {
		ws = append(ws, d.w)
	}
	return ws
}

// awaitStopAccepting waits until every worker the operation set draining
// has stopped accepting: it said so (STOPPING=1, which deployd's Node.js
// preload sends in the same turn as it closes its listeners), neither it
// nor a child of it
// holds one of its listening sockets any more, or it is gone. A stop
// signal is not handled at once (a busy or loaded process takes its time),
// and until then the old worker still takes new connections from the
// shared queue: once this returns, only the new workers do. A server that
// keeps its listener open while it drains, and does not say it stopped,
// is waited for stopAcceptingMax at most (less when its stop_timeout is
// shorter), once, at the end of the operation.
func (o *op) awaitStopAccepting() {
	tick := time.NewTicker(stopAcceptingPoll)
	defer tick.Stop()
	wait := stopAcceptingMin
	for _, d := range o.drains {
		wait = max(wait, min(d.w.spec.StopTimeout, stopAcceptingMax))
	}
	limit := time.NewTimer(wait)
	defer limit.Stop()
	// Then the escaped processes, on the same bound.
	defer func(until time.Time) {
		for _, d := range o.drains {
			d.w.endEscaped(until, o.s.log)
		}
	}(time.Now().Add(wait))
	for _, d := range o.drains {
		socks := servingInodes(d.w.spec) // a dead agent's steering group too
		for !d.w.stoppedAccepting() && holdsListener(d.w.PID, socks) {
			select {
			case <-d.done:
			case <-o.s.cancel:
				return
			case <-limit.C:
				return
			case <-tick.C:
				continue
			}
			break
		}
	}
}

// stopAcceptingPoll is how often awaitStopAccepting looks in /proc (no
// event tells when a process closes a descriptor), and stopAcceptingMax
// how long it waits in all. A loaded machine can take seconds to run a
// stop handler; until it has, the old worker still takes connections, so
// the bound is generous, and only a server that keeps its listener open
// while it drains ever reaches it.
const (
	stopAcceptingPoll = 10 * time.Millisecond
	stopAcceptingMin  = 2 * time.Second
	stopAcceptingMax  = 10 * time.Second
)

// listenerInodes returns the socket inodes of spec's listeners.
func listenerInodes(spec *Spec) map[uint64]bool {
	socks := map[uint64]bool{}
	for _, l := range spec.Listeners {
		fd, err := l.Fd()
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) == nil {
			socks[st.Ino] = true
		}
	}
	return socks
}

// maxTree bounds the processes of a worker's tree that holdsListener and
// openConnections look at.
const maxTree = 256

// processTree returns pid and its descendants, maxTree at most, from
// /proc (children of each thread).
func processTree(pid int) []int {
	queue := []int{pid}
	for i := 0; i < len(queue) && len(queue) < maxTree; i++ {
		p := "/proc/" + strconv.Itoa(queue[i]) + "/task/"
		tasks, _ := os.ReadDir(p)
		for _, t := range tasks {
			b, _ := boundedfile.ReadFile(p+t.Name()+"/children", boundedfile.Options{Max: 64 << 10})
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil && len(queue) < maxTree {
					queue = append(queue, c)
				}
			}
		}
	}
	return queue
}

// holdsListener reports whether pid or one of its descendants has one of
// socks open. False once the process is gone, or where /proc does not
// tell (then nothing is waited for).
func holdsListener(pid int, socks map[uint64]bool) bool {
	if pid <= 0 || len(socks) == 0 {
		return false
	}
	for _, p := range processTree(pid) {
		held, _ := sockdiag.Inodes(p)
		for ino := range held {
			if socks[ino] {
				return true
			}
		}
	}
	return false
}

// openConnections sets Connections in sts, the statuses of the draining
// workers ws (in the same order): the established TCP connections on the
// ports of a worker's listeners that its process, or a descendant, holds.
// One dump of the kernel's sockets (sock_diag) serves them all. Left nil
// (unknown) where the dump fails or the worker's /proc/PID/fd may not be
// read (an agent not run as root, a worker of another user). Run outside
// the loop: it reads /proc and asks the kernel.
func openConnections(sts []WorkerStatus, ws []*Worker) {
	if len(ws) == 0 {
		return
	}
	ports := make([]map[uint16]bool, len(ws))
	all := map[uint16]bool{}
	for i, w := range ws {
		ports[i] = listenerPorts(w.spec)
		for p := range ports[i] {
			all[p] = true
		}
	}
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Established},
		func(s *sockdiag.Socket) bool { return all[s.Local.Port()] })
	if err != nil {
		return
	}
	for i, w := range ws {
		held := map[uint64]bool{}
		for k, p := range processTree(w.PID) {
			inos, err := sockdiag.Inodes(p)
			if k == 0 && err != nil && !errors.Is(err, os.ErrNotExist) {
				held = nil // not ours to read: unknown
				break
			}
			for ino := range inos {
				held[ino] = true
			}
		}
		if held == nil {
			continue
		}
		n := 0
		for _, s := range socks {
			if held[s.Inode] && ports[i][s.Local.Port()] {
				n++
			}
		}
		sts[i].Connections = &n
	}
}

// listenerPorts returns the ports of spec's TCP listeners.
func listenerPorts(spec *Spec) map[uint16]bool {
	ports := map[uint16]bool{}
	for _, l := range spec.Listeners {
		if l.Network == "unix" {
			continue
		}
		if a, err := l.LocalAddr(); err == nil {
			if ap, err := netip.ParseAddrPort(a); err == nil {
				ports[ap.Port()] = true
			}
		}
	}
	return ports
}
