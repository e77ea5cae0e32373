package workers

import (
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// quietFixture is a listener of this process with two connections queued
// (not accepted) and one accepted whose request is not read.
type quietFixture struct {
	l       *net.TCPListener
	port    uint16
	clients []net.Conn
	read    *net.TCPConn // accepted, its request unread
}

func newQuietFixture(t *testing.T) *quietFixture {
	t.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f := &quietFixture{l: l, port: uint16(l.Addr().(*net.TCPAddr).Port)}
	for range 3 {
		c, err := net.DialTimeout("tcp4", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		f.clients = append(f.clients, c)
	}
	l.SetDeadline(time.Now().Add(5 * time.Second))
	if f.read, err = l.AcceptTCP(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.read.Close() })
	return f
}

func (f *quietFixture) ports() map[uint16]bool { return map[uint16]bool{f.port: true} }

func self() []int { return []int{os.Getpid()} }

// answerKept reads the request on c and answers it, keeping c open (kept alive).
func answerKept(t *testing.T, c *net.TCPConn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 18)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
}

// The stop is held while connections wait in the accept queue or an
// accepted one is unread, until the grace passes.
func TestQuietHeldUntilGrace(t *testing.T) {
	f := newQuietFixture(t)
	grace := 150 * time.Millisecond
	r := awaitQuiet(self, f.ports(), grace, nil)
	if r.Outcome != quietGrace || r.Waited < grace {
		t.Fatalf("want the grace to pass, got %+v", r)
	}
	if r.Queued != 2 || r.Unread != 1 || r.Idle != 0 {
		t.Fatalf("want 2 queued and 1 unread, got %+v", r)
	}
}

// Once the queued connections are accepted and every request answered,
// the stop goes at once, with the kept-alive connections counted idle.
func TestQuietEndsWhenDry(t *testing.T) {
	f := newQuietFixture(t)
	done := make(chan quietReport, 1)
	go func() { done <- awaitQuiet(self, f.ports(), 30*time.Second, nil) }()
	answerKept(t, f.read)
	select {
	case r := <-done:
		t.Fatalf("the stop went with two connections still queued: %+v", r)
	default:
	}
	for range 2 {
		f.l.SetDeadline(time.Now().Add(5 * time.Second))
		c, err := f.l.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case r := <-done:
			t.Fatalf("the stop went with a connection accepted but unread: %+v", r)
		default:
		}
		answerKept(t, c)
	}
	select {
	case r := <-done:
		if r.Outcome != quietDone || r.Idle != 3 || r.waiting() {
			t.Fatalf("want quiet with 3 idle kept-alive connections, got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the quiet phase did not end once nothing waited")
	}
}

// A worker that exits ends its quiet phase.
func TestQuietEndsWhenGone(t *testing.T) {
	f := newQuietFixture(t)
	gone := make(chan struct{})
	close(gone)
	if r := awaitQuiet(self, f.ports(), 30*time.Second, gone); r.Outcome != quietGone {
		t.Fatalf("want gone, got %+v", r)
	}
}
