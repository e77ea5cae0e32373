package workers

import (
	"net/netip"
	"slices"
	"time"

	"github.com/deployd/deployd/internal/sockdiag"
)

// ListenerQueue is a listener's accept queue at the last tick: the
// connections the kernel completed that no worker accepted yet, and the
// backlog (how many may wait before the kernel drops new ones). Of a
// steered listener, the sums over the workers' own sockets.
type ListenerQueue struct {
	Listen          string // "tcp 127.0.0.1:8080"
	Queued, Backlog int
}

// queueReading is one accept queue read at a tick: a listener's (w nil),
// or a worker's own socket of a steered listener.
type queueReading struct {
	listen          string
	w               *Worker
	steered         bool
	queued, backlog int
}

// steeredAddr is a steered listener's name and bound address.
type steeredAddr struct {
	listen string
	addr   netip.AddrPort
}

// sampleQueues reads the accept queue of each of the app's TCP listeners
// into st.queueReadings. A shared listener's is its own socket's
// (TCP_INFO). A steered listener's socket in the agent is the group's
// anchor, bound and never listening: its queue is always empty. The
// connections wait in the workers' own sockets, read from one dump of the
// kernel's listening sockets (inet_diag), each matched to its worker by
// inode. Where the dump fails, a steered listener has no reading (unknown,
// not 0). Run by the loop every tick.
func (s *Supervisor) sampleQueues(st *state) {
	var rs []queueReading
	var steered []steeredAddr
	for _, b := range st.spec.Listeners {
		if b.Network == "unix" {
			continue
		}
		name := b.Network + " " + b.Address
		if b.Steered() == nil {
			if n, backlog, ok := b.AcceptQueue(); ok {
				rs = append(rs, queueReading{listen: name, queued: n, backlog: backlog})
			}
			continue
		}
		if a, err := b.LocalAddr(); err == nil {
			if ap, err := netip.ParseAddrPort(a); err == nil {
				steered = append(steered, steeredAddr{listen: name, addr: ap})
			}
		}
	}
	if len(steered) > 0 {
		rs = append(rs, s.sampleSteered(st, steered)...)
	}
	st.queueReadings = rs
}

// sampleSteered reads the steered listeners' queues: each listener's
// total, and each worker's own socket's.
func (s *Supervisor) sampleSteered(st *state, addrs []steeredAddr) []queueReading {
	ports := map[uint16]bool{}
	for _, a := range addrs {
		ports[a.addr.Port()] = true
	}
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen},
		func(k *sockdiag.Socket) bool { return ports[k.Local.Port()] })
	if err != nil {
		if !st.queueDumpFailed {
			s.log.Warn("cannot read the steered workers' accept queues", "error", err)
		}
		st.queueDumpFailed = true
		return nil
	}
	st.queueDumpFailed = false
	var rs []queueReading
	group := map[uint64]bool{} // the inodes of the steered listeners' sockets
	for _, a := range addrs {
		r := queueReading{listen: a.listen, steered: true}
		for _, k := range socks {
			if sameAddr(k.Local, a.addr) {
				r.queued += int(k.RecvQ)
				r.backlog += int(k.SendQ)
				group[k.Inode] = true
			}
		}
		rs = append(rs, r)
	}
	for _, w := range st.workers() {
		if !findSockets(w, group) {
			continue // unknown: not ours to read
		}
		for _, a := range addrs {
			r := queueReading{listen: a.listen, w: w, steered: true}
			for _, k := range socks {
				if sameAddr(k.Local, a.addr) && slices.Contains(w.sockets, k.Inode) {
					r.queued += int(k.RecvQ)
					r.backlog += int(k.SendQ)
				}
			}
			rs = append(rs, r)
		}
	}
	return rs
}

// socketsRetry is how long findSockets waits before it looks in a
// worker's /proc/PID/fd again after it found none of its sockets there.
const socketsRetry = 10 * time.Second

// findSockets makes sure w.sockets is known: for a worker adopted already
// in the steering map (the agent holds no copy of its sockets), its
// sockets of the group are looked for in its /proc/PID/fd once. False
// when they cannot be known (the process is another user's, or gone).
func findSockets(w *Worker, group map[uint64]bool) bool {
	if w.sockets != nil {
		return true
	}
	if w.PID <= 0 || w.State() != Ready || time.Since(w.socketsLooked) < socketsRetry {
		return false // the loop reads no /proc for a worker on its way out, nor every tick
	}
	w.socketsLooked = time.Now()
	held, err := sockdiag.Inodes(w.PID)
	if err != nil {
		return false
	}
	var own []uint64
	for ino := range held {
		if group[ino] {
			own = append(own, ino)
		}
	}
	if len(own) == 0 {
		return false // none open (yet, or any more): look again after socketsRetry
	}
	w.sockets = own
	return true
}

// sameAddr reports whether a socket bound to a serves the listener bound
// to b (an IPv4 address may come back mapped in IPv6).
func sameAddr(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// memberInodes are the inodes of ms's sockets (nil for none).
func memberInodes(ms []member) []uint64 {
	var out []uint64
	for _, m := range ms {
		if ino, err := m.sock.Inode(); err == nil {
			out = append(out, ino)
		}
	}
	return out
}

// listenerQueues are the listeners' readings of the last tick.
func (st *state) listenerQueues() []ListenerQueue {
	var out []ListenerQueue
	for _, r := range st.queueReadings {
		if r.w == nil {
			out = append(out, ListenerQueue{Listen: r.listen, Queued: r.queued, Backlog: r.backlog})
		}
	}
	return out
}

// workerQueue is how many connections wait in w's own sockets (steered
// listeners) at the last tick; ok is false where that is not known or w
// has none.
func (st *state) workerQueue(w *Worker) (n int, ok bool) {
	for _, r := range st.queueReadings {
		if r.w == w {
			n, ok = n+r.queued, true
		}
	}
	return n, ok
}
