package dashboard

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// A page that stops reading is dropped once clientBytes wait for it, long
// before clientBuffer messages; what it had queued is let go.
func TestPageDroppedAfterItsBytes(t *testing.T) {
	h := newHub(Options{Poll: time.Second, MaxClients: 2, LogLines: 200})
	j := h.join() // the test is the hub's owner: run is not started
	msg := make([]byte, 100<<10)
	sent := 0
	for ; sent < clientBuffer; sent++ {
		if _, open := h.clients[j.c]; !open {
			break
		}
		h.broadcast(msg)
	}
	if want := clientBytes/len(msg) + 1; sent != want {
		t.Errorf("dropped after %d messages of %d KiB, want %d (clientBytes %d KiB)", sent, len(msg)>>10, want, clientBytes>>10)
	}
	select {
	case <-j.c.gone:
	default:
		t.Error("dropped page: gone not closed")
	}
	if _, ok := <-j.c.ch; ok || len(j.c.ch) != 0 {
		t.Error("dropped page: its channel not closed and drained")
	}
	if q := j.c.queued.Load(); q != int64(len(j.snap)) {
		t.Errorf("dropped page: %d bytes still counted, want its unwritten snapshot's %d", q, len(j.snap))
	}
}

// chattySource logs 4 KiB lines of 8 apps as fast as the hub takes them.
type chattySource struct{ fakeSource }

func (chattySource) Logs(ctx context.Context, errStream bool, _ int, fn func(api.LogLine)) error {
	long := strings.Repeat("x", maxLineBytes)
	for i := 0; ctx.Err() == nil; i++ {
		fn(api.LogLine{App: fmt.Sprintf("app%d", i%8), Line: long})
	}
	return nil
}

// trackingListener tells when the server closes a connection it accepted,
// and gives each a small send buffer.
type trackingListener struct {
	net.Listener
	closed chan struct{} // one per closed connection
}

type trackedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// A small send buffer: the page's stall shows in ms, not after the
	// kernel buffered megabytes (tcp_wmem's max differs between machines).
	if err := c.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		c.Close()
		return nil, err
	}
	return &trackedConn{Conn: c, closed: l.closed}, nil
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}

// A page that stops reading beside chatty apps: the dashboard closes its
// connection as soon as the hub drops it, not at the write deadline.
func TestStalledPageClosedWhenDropped(t *testing.T) {
	srv, err := New(Options{Source: chattySource{}, Token: "secret", Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &trackingListener{Listener: inner, closed: make(chan struct{}, 4)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx, ln) })
	defer func() { cancel(); wg.Wait() }()

	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := fmt.Fprintf(c, "GET /secret/events HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ln.closed:
		t.Logf("the stalled page's connection closed %s after its request", time.Since(start).Round(time.Millisecond))
	case <-time.After(writeTimeout - time.Second):
		t.Fatalf("the stalled page's connection still open %s after its request, want it closed when dropped", writeTimeout-time.Second)
	}
}
