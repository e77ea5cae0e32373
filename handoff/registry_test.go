package handoff

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// want is a Want for a loopback TCP listener named http.
func want(addr string) Want {
	return Want{URL: "tcp://" + addr + "#http", Network: "tcp", Address: addr, Name: "http"}
}

// freeAddr is a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// listening reports whether something accepts connections on addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestFdAfterCloseIsAnError(t *testing.T) {
	l, err := Open("tcp", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	if fd, err := l.Fd(); err != nil || fd < 3 {
		t.Fatalf("Fd() = %d, %v before Close", fd, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if fd, err := l.Fd(); !errors.Is(err, ErrClosed) || fd != 0 {
		t.Errorf("Fd() after Close = %d, %v; want 0 and ErrClosed", fd, err)
	}
	if _, err := l.Nonblocking(); !errors.Is(err, ErrClosed) {
		t.Errorf("Nonblocking() after Close = %v, want ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// A listener stays open while any lease holds it: the case of a reload
// whose rollback failed, where the new spec's workers still serve while
// the previous spec's lease is released.
func TestRegistryClosesOnLastLease(t *testing.T) {
	r := NewRegistry(nil, nil, nil)
	defer r.Close()
	shared, added := freeAddr(t), freeAddr(t)
	old, err := r.Acquire("web", []Want{want(shared)})
	if err != nil {
		t.Fatal(err)
	}
	next, err := r.Acquire("web", []Want{want(shared), want(added)})
	if err != nil {
		t.Fatal(err)
	}
	if b := next.Bound(); len(b) != 2 || b[0].Listener != old.Bound()[0].Listener || b[1].Name != "http" {
		t.Fatalf("the second lease must share the open listener: %+v", b)
	}
	if n := r.leases("tcp", shared); n != 2 {
		t.Errorf("leases(shared) = %d, want 2", n)
	}
	old.Release()
	old.Release() // twice is a no-op
	if n := r.leases("tcp", shared); n != 1 {
		t.Errorf("leases(shared) after releasing one = %d, want 1", n)
	}
	for _, b := range next.Bound() {
		if _, err := b.Fd(); err != nil || !listening(b.Address) {
			t.Errorf("%s: closed while a lease holds it (%v)", b.Address, err)
		}
	}
	l := next.Bound()[0].Listener
	next.Release()
	if _, err := l.Fd(); !errors.Is(err, ErrClosed) {
		t.Errorf("Fd() after the last lease = %v, want ErrClosed", err)
	}
	if listening(shared) || listening(added) {
		t.Error("a listener no lease holds still accepts")
	}
	if n := r.leases("tcp", shared); n != 0 {
		t.Errorf("leases(shared) = %d, want 0", n)
	}
}

func TestRegistryFailedAcquireLeasesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	r := NewRegistry(newFakeStore(), nil, nil)
	defer r.Close()
	before := fdCount(t)
	free := freeAddr(t)
	_, err = r.Acquire("web", []Want{want(free), want(busy.Addr().String())})
	if !errors.Is(err, ErrAddressInUse) || !strings.Contains(err.Error(), "tcp://"+busy.Addr().String()) {
		t.Fatalf("Acquire with a busy address = %v, want ErrAddressInUse naming the URL", err)
	}
	if n := r.leases("tcp", free); n != 0 || listening(free) {
		t.Errorf("the free address stays open after a failed Acquire (leases %d)", n)
	}
	if after := fdCount(t); after != before {
		t.Errorf("failed Acquire leaked descriptors: %d before, %d after", before, after)
	}
}

func TestRegistryCloseKeepsNothing(t *testing.T) {
	r := NewRegistry(nil, nil, nil)
	lease, err := r.Acquire("web", []Want{want("127.0.0.1:0")})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Bound()[0].Fd(); !errors.Is(err, ErrClosed) {
		t.Errorf("Fd() after Registry.Close = %v, want ErrClosed", err)
	}
	lease.Release() // after Close: nothing left to release, no panic
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// acceptedNoDelay accepts one connection on l (dialed here) and returns
// its TCP_NODELAY, as a worker's accept would get it.
func acceptedNoDelay(t *testing.T, l *Listener) int {
	t.Helper()
	addr, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fd, err := l.Fd()
	if err != nil {
		t.Fatal(err)
	}
	nfd, _, err := unix.Accept(int(fd)) // queued already: does not block
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nfd)
	v, err := unix.GetsockoptInt(nfd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Connections accepted on a listener the registry leases have TCP_NODELAY
// as the lease's Want says; a later lease with another setting changes it
// for the connections accepted from then on.
func TestRegistryTCPNoDelay(t *testing.T) {
	r := NewRegistry(nil, nil, nil)
	w := want("127.0.0.1:0")
	w.NoDelay = true
	lease, err := r.Acquire("web", []Want{w})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	l := lease.Bound()[0].Listener
	if v := acceptedNoDelay(t, l); v == 0 {
		t.Errorf("accepted connection TCP_NODELAY = %d, want on", v)
	}
	w.NoDelay = false
	off, err := r.Acquire("web", []Want{w})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Release()
	if v := acceptedNoDelay(t, l); v != 0 {
		t.Errorf("with tcp_nodelay = false: accepted connection TCP_NODELAY = %d, want 0", v)
	}
}

// AcceptQueue counts the connections no one accepted yet.
func TestAcceptQueue(t *testing.T) {
	l, err := Open("tcp", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr, _ := l.LocalAddr()
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, backlog, ok := l.AcceptQueue()
		if ok && n == 2 && backlog > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcceptQueue() = %d, %d, %v; want 2 queued", n, backlog, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A learned listener is shared with the lease of another spec that learned
// the same address, outside Bound, and closes when the last lease holding
// it is released; a released lease learns nothing more.
func TestLeaseLearnSharesAndReleases(t *testing.T) {
	r := NewRegistry(nil, nil, nil)
	defer r.Close()
	addr := freeAddr(t)
	a, err := r.Acquire("web", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Acquire("web", nil)
	if err != nil {
		t.Fatal(err)
	}
	la, err := a.Learn("web", want(addr))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := a.Learn("web", want(addr)); err != nil || again.Listener != la.Listener {
		t.Errorf("learned again: %v, %v; want the same listener", again, err)
	}
	lb, err := b.Learn("web", want(addr))
	if err != nil || lb.Listener != la.Listener {
		t.Fatalf("the second lease learned %v, %v; want the first's socket", lb, err)
	}
	if len(a.Bound()) != 0 || len(a.Learned()) != 1 || r.leases("tcp", addr) != 2 {
		t.Errorf("Bound %v, Learned %v, leases %d; want none, one, 2", a.Bound(), a.Learned(), r.leases("tcp", addr))
	}
	a.Release()
	if !listening(addr) {
		t.Fatal("the socket closed while a lease holds it")
	}
	if _, err := a.Learn("web", want(freeAddr(t))); !errors.Is(err, ErrLeaseReleased) {
		t.Errorf("Learn on a released lease: %v, want ErrLeaseReleased", err)
	}
	b.Release()
	if listening(addr) {
		t.Error("the socket listens after its last lease went")
	}
}
