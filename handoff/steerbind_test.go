package handoff

import (
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An auto listener is a shared socket that serves every connection until
// a worker's bind takes a member; SteerOnBind then stops it listening and
// what waited in its queue moves to the member, none reset. The next agent
// reads from the socket that its steering is on.
func TestAutoListenerSharedUntilABindTurnsSteeringOn(t *testing.T) {
	needSteering(t)
	store := newFakeStore()
	r := NewRegistry(store, nil, nil)
	defer r.Close()
	lease, err := r.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceAuto)})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	l := lease.Bound()[0].Listener
	addr, _ := l.LocalAddr()
	if l.Steered() != nil || l.Balance() != BalanceShared || l.Steerable() == nil {
		t.Fatalf("before a bind: steered %v, balance %q: want shared, with a group for later", l.Steered(), l.Balance())
	}
	dup, err := unix.FcntlInt(mustFd(t, l), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		t.Fatal(err)
	}
	sf := os.NewFile(uintptr(dup), "shared")
	defer sf.Close()
	shared, err := net.FileListener(sf)
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, shared, addr) // as a plain shared socket: fd 3 apps

	// A connection waits in the shared queue when the bind comes.
	waiting, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	m, err := l.Member()
	if err != nil {
		t.Fatal(err)
	}
	mine, err := net.FileListener(m.file)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if !l.SteerOnBind() || l.SteerOnBind() {
		t.Fatal("SteerOnBind must turn the steering on once")
	}
	if l.Steered() == nil || l.Balance() != "even" {
		t.Fatalf("after the bind: steered %v, balance %q, want even", l.Steered(), l.Balance())
	}
	if acceptsConnections(mustFd(t, l)) {
		t.Fatal("the shared socket still listens")
	}
	mine.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := mine.Accept()
	if err != nil {
		t.Fatalf("the connection queued on the shared socket did not move to the member: %v", err)
	}
	c.Close()

	next := newFakeStore()
	for k, f := range store.added {
		next.files[k] = f
	}
	r2 := NewRegistry(next, nil, nil)
	defer r2.Close()
	lease2, err := r2.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceAuto)})
	if err != nil {
		t.Fatal(err)
	}
	defer lease2.Release()
	if l2 := lease2.Bound()[0].Listener; l2.Steered() == nil {
		t.Fatal("the next agent does not see that the steering is on")
	}
}

func mustFd(t *testing.T, l *Listener) uintptr {
	t.Helper()
	fd, err := l.Fd()
	if err != nil {
		t.Fatal(err)
	}
	return fd
}
