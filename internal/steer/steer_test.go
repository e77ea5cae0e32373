package steer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needGroup returns a group in mode m, or skips where BPF is unavailable
// (fails under CI=true, where it must run).
func needGroup(t *testing.T, m Mode) *Group {
	t.Helper()
	g, err := New(m)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and kernel steering is unavailable: %v", err)
		}
		t.Skipf("kernel steering unavailable: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// pool is an anchor and n listening sockets in slots 0..n-1.
type pool struct {
	addr  string
	socks []*os.File
}

func newPool(t *testing.T, g *Group, n int) *pool {
	t.Helper()
	a, err := Anchor("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	sa, err := unix.Getsockname(int(a.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	p := &pool{addr: fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)}
	for i := range n {
		p.socks = append(p.socks, p.listen(t, g))
		if err := g.Set(i, p.socks[i].Fd()); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.SetActive(n); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pool) listen(t *testing.T, g *Group) *os.File {
	t.Helper()
	f, err := g.Listen("tcp4", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// queued is how many connections wait in f's accept queue.
func queued(t *testing.T, f *os.File) int {
	t.Helper()
	info, err := unix.GetsockoptTCPInfo(int(f.Fd()), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.Unacked)
}

// dial connects n clients from source address src ("" = any); they are
// closed at cleanup.
func dial(t *testing.T, addr, src string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	var cs []net.Conn
	for range n {
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			t.Fatalf("dial %s from %q: %v", addr, src, err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

func counts(t *testing.T, socks []*os.File) []int {
	out := make([]int, len(socks))
	for i, f := range socks {
		out[i] = queued(t, f)
	}
	return out
}

func TestEvenSpreadsAcrossSockets(t *testing.T) {
	g := needGroup(t, Even)
	p := newPool(t, g, 4)
	dial(t, p.addr, "", 200)
	got := counts(t, p.socks)
	sum := 0
	for i, n := range got {
		sum += n
		if n != 50 { // one client after the other: turns are exact
			t.Errorf("socket %d got %d of 200 connections, want 50 (all: %v)", i, n, got)
		}
	}
	if sum != 200 {
		t.Errorf("%d of 200 connections queued on the slots: %v", sum, got)
	}
	for i := range p.socks {
		if n, err := g.Count(i); err != nil || n != 50 {
			t.Errorf("the count of slot %d is %d, %v; want 50", i, n, err)
		}
	}
}

func TestStickyKeepsAClientOnOneSocket(t *testing.T) {
	g := needGroup(t, Sticky)
	p := newPool(t, g, 4)
	used := map[int]bool{}
	for c := 2; c < 12; c++ {
		before := counts(t, p.socks)
		dial(t, p.addr, fmt.Sprintf("127.0.0.%d", c), 6)
		after := counts(t, p.socks)
		var got []int
		for i := range after {
			if after[i] != before[i] {
				got = append(got, i)
			}
		}
		if len(got) != 1 || after[got[0]]-before[got[0]] != 6 {
			t.Fatalf("127.0.0.%d: connections went to sockets %v (before %v, after %v); want all on one", c, got, before, after)
		}
		used[got[0]] = true
	}
	if len(used) < 2 {
		t.Errorf("10 clients all on socket(s) %v: the client address is not hashed", used)
	}
}

func TestClearedAndSpareSlotsGetNone(t *testing.T) {
	g := needGroup(t, Even)
	p := newPool(t, g, 3)
	if err := g.Clear(1); err != nil {
		t.Fatal(err)
	}
	spare := p.listen(t, g)
	if err := g.Set(3, spare.Fd()); err != nil { // past Active: a spare
		t.Fatal(err)
	}
	dial(t, p.addr, "", 60)
	got := counts(t, append(p.socks, spare))
	if got[1] != 0 || got[3] != 0 || got[0]+got[2] != 60 {
		t.Errorf("queues %v: the cleared slot 1 and the spare must get none", got)
	}
}

func TestStickyClientsOfAGoneSocketMoveTogether(t *testing.T) {
	g := needGroup(t, Sticky)
	p := newPool(t, g, 3)
	dial(t, p.addr, "127.0.0.2", 3)
	before := counts(t, p.socks)
	home := -1
	for i, n := range before {
		if n == 3 {
			home = i
		}
	}
	if home < 0 {
		t.Fatalf("queues %v: the client is not on one socket", before)
	}
	if err := g.Clear(home); err != nil { // as when its worker goes
		t.Fatal(err)
	}
	dial(t, p.addr, "127.0.0.2", 4)
	after := counts(t, p.socks)
	moved := 0
	for i := range after {
		if d := after[i] - before[i]; d != 0 {
			if d != 4 || i == home {
				t.Fatalf("queues %v → %v: the client's 4 new connections must all reach one other socket", before, after)
			}
			moved++
		}
	}
	if moved != 1 {
		t.Fatalf("queues %v → %v", before, after)
	}
}

// TestClosedSocketHandsOnItsQueue: connections queued on a socket that
// closes are accepted from another (request migration), none reset.
func TestClosedSocketHandsOnItsQueue(t *testing.T) {
	g := needGroup(t, Even)
	p := newPool(t, g, 2)
	if err := g.SetActive(1); err != nil { // everything to slot 0
		t.Fatal(err)
	}
	cs := dial(t, p.addr, "", 20)
	if n := queued(t, p.socks[0]); n != 20 {
		t.Fatalf("%d connections queued on slot 0, want 20", n)
	}
	p.socks[0].Close()
	if got := queued(t, p.socks[1]); got != 20 {
		t.Fatalf("after the close, %d of 20 queued connections are on the other socket", got)
	}
	echoAll(t, p.socks[1:], cs)
}

// echoAll accepts len(cs) connections from the sockets socks, answers
// each, and checks every client got its answer (none reset).
func echoAll(t *testing.T, socks []*os.File, cs []net.Conn) {
	t.Helper()
	for _, f := range socks {
		ln, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("y"))
				c.Close()
			}
		}()
	}
	for i, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "y" {
			t.Errorf("client %d: got %q, %v; want an answer", i, b, err)
		}
	}
}

// TestHeldConnectionsAreServedAfterUnhold: while held, connections wait
// on the hold socket; after Unhold and its close, the workers get them.
func TestHeldConnectionsAreServedAfterUnhold(t *testing.T) {
	g := needGroup(t, Sticky)
	p := newPool(t, g, 2)
	hold := p.listen(t, g)
	if err := g.Hold(hold.Fd()); err != nil {
		t.Fatal(err)
	}
	cs := dial(t, p.addr, "127.0.0.3", 5)
	cs = append(cs, dial(t, p.addr, "", 5)...)
	if got := counts(t, append(p.socks, hold)); got[0]+got[1] != 0 || got[2] != 10 {
		t.Fatalf("held: queues %v, want all 10 on the hold socket", got)
	}
	if err := g.Unhold(); err != nil {
		t.Fatal(err)
	}
	hold.Close()
	got := counts(t, p.socks)
	if got[0]+got[1] != 10 {
		t.Fatalf("after unhold: queues %v, want the 10 held connections", got)
	}
	echoAll(t, p.socks, cs)
}

func TestFromFileTakesTheGroupOver(t *testing.T) {
	g := needGroup(t, Sticky)
	f, err := g.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g2, err := FromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if m, err := g2.Mode(); err != nil || m != Sticky {
		t.Fatalf("mode through the passed program: %v, %v; want sticky", m, err)
	}
	p := newPool(t, g2, 2) // slots set through the taken-over maps
	dial(t, p.addr, "", 10)
	if got := counts(t, p.socks); got[0]+got[1] != 10 {
		t.Fatalf("queues %v", got)
	}
}

func TestUnavailableWrapsTheReason(t *testing.T) {
	err := unavailable("load", unix.EPERM)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("%v", err)
	}
}

// TestFlipSwitchesAGenerationAtOnce: sockets staged in the standby half
// get no connection, however many arrive, until Flip; from then on every
// new connection goes to them and none to the old ones, whose queue moves
// to the new when they close.
func TestFlipSwitchesAGenerationAtOnce(t *testing.T) {
	for _, m := range []Mode{Even, Sticky} {
		t.Run(m.String(), func(t *testing.T) {
			g := needGroup(t, m)
			p := newPool(t, g, 3)
			news := make([]*os.File, 3)
			for i := range news {
				news[i] = p.listen(t, g)
				if err := g.Stage(i, news[i].Fd()); err != nil {
					t.Fatal(err)
				}
			}
			all := append(slices.Clone(p.socks), news...)
			cs := clients(t, p.addr)
			if got := counts(t, all); got[3]+got[4]+got[5] != 0 || got[0]+got[1]+got[2] != len(cs) {
				t.Fatalf("before the flip: queues %v, want all %d on the old sockets 0-2", got, len(cs))
			}
			if err := g.Flip(); err != nil {
				t.Fatal(err)
			}
			before := counts(t, all)
			cs = append(cs, clients(t, p.addr)...)
			after := counts(t, all)
			if after[0]+after[1]+after[2] != before[0]+before[1]+before[2] || after[3]+after[4]+after[5] != len(cs)/2 {
				t.Fatalf("after the flip: queues %v → %v, want all %d new connections on the new sockets 3-5", before, after, len(cs)/2)
			}
			if n, err := g.Count(0); err != nil || n == 0 {
				t.Errorf("slot 0 counted %d, %v, over both halves", n, err)
			}
			for _, f := range p.socks { // the old generation drains
				f.Close()
			}
			if got := counts(t, news); got[0]+got[1]+got[2] != len(cs) {
				t.Fatalf("after the old sockets closed: queues %v, want all %d", got, len(cs))
			}
			echoAll(t, news, cs)
		})
	}
}

// clients dials 2 connections from each of 10 client addresses, one
// address after the other.
func clients(t *testing.T, addr string) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for c := 2; c < 12; c++ {
		cs = append(cs, dial(t, addr, fmt.Sprintf("127.0.0.%d", c), 2)...)
	}
	return cs
}

// TestFlipCarriesOverFromFile: the next agent reads which half is live,
// so that Set goes on writing there.
func TestFlipCarriesOverFromFile(t *testing.T) {
	g := needGroup(t, Even)
	p := newPool(t, g, 1)
	next := p.listen(t, g)
	if err := g.Stage(0, next.Fd()); err != nil {
		t.Fatal(err)
	}
	if err := g.Flip(); err != nil {
		t.Fatal(err)
	}
	f, err := g.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g2, err := FromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if !g2.CanFlip() {
		t.Fatal("a group taken over lost its standby half")
	}
	third := p.listen(t, g2)
	if err := g2.Set(0, third.Fd()); err != nil { // replaces next, in the live half
		t.Fatal(err)
	}
	dial(t, p.addr, "", 6)
	if got := counts(t, []*os.File{p.socks[0], next, third}); got[2] != 6 {
		t.Fatalf("queues %v: Set after a takeover must write to the live half", got)
	}
}

// TestStickyMigrationFollowsTheClient: the connections queued on a socket
// that closes move where their clients' new connections go (the program
// reads the client from the migrating connection, which has no packet),
// not wherever their 4-tuples' hashes fall.
func TestStickyMigrationFollowsTheClient(t *testing.T) {
	g := needGroup(t, Sticky)
	p := newPool(t, g, 3)
	// home dials n connections from src and returns the socket they all
	// reached.
	home := func(src string, n int) int {
		t.Helper()
		before := counts(t, p.socks)
		dial(t, p.addr, src, n)
		after := counts(t, p.socks)
		at := -1
		for i := range after {
			switch d := after[i] - before[i]; {
			case d == n:
				at = i
			case d != 0:
				t.Fatalf("client %s: queues %v → %v, want its %d connections on one socket", src, before, after, n)
			}
		}
		if at < 0 {
			t.Fatalf("client %s: queues %v → %v", src, before, after)
		}
		return at
	}
	const perClient = 8
	homes := map[string]int{}
	for i := range 12 {
		src := fmt.Sprintf("127.0.0.%d", i+2)
		homes[src] = home(src, perClient)
	}
	gone := homes["127.0.0.2"]
	// As when a worker drains: its socket leaves the map (its clients'
	// new connections go to the next live one), then closes.
	if err := g.Clear(gone); err != nil {
		t.Fatal(err)
	}
	want := counts(t, p.socks)
	moving := 0
	for src, h := range homes {
		if h == gone {
			next := home(src, 1)
			want[next] += 1 + perClient // the new one, and the queued ones to come
			moving++
		}
	}
	p.socks[gone].Close()
	want = slices.Delete(want, gone, gone+1)
	got := counts(t, slices.Delete(slices.Clone(p.socks), gone, gone+1))
	if !slices.Equal(got, want) {
		t.Fatalf("after socket %d closed with the %d queued connections of %d clients: queues %v, want %v (each client's with its new connection)",
			gone, moving*perClient, moving, got, want)
	}
	t.Logf("%d connections of %d clients moved with them; queues %v", moving*perClient, moving, got)
}
