package worker

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// get sends one HTTP/1.1 request on c and returns the response.
func get(t *testing.T, c net.Conn, r *bufio.Reader) *http.Response {
	t.Helper()
	if _, err := fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// A keep-alive connection that was idle when the drain began still gets
// its next request answered, with Connection: close, and only then is it
// closed; the drain ends once it is gone.
func TestDrainServesIdleKeepAliveThenCloses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	})})
	s.Serve([]net.Listener{l})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if resp := get(t, c, r); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before the drain: %s, close %v", resp.Status, resp.Close)
	}
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- s.Drain(ctx)
	}()
	for !s.draining.Load() {
		time.Sleep(time.Millisecond)
	}
	resp := get(t, c, r) // within IdleGrace: the connection is still open
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("during the drain: %s, close %v; want 200 with Connection: close", resp.Status, resp.Close)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("after the Connection: close answer, read = %v, want EOF", err)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Errorf("Drain = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return")
	}
}

// An idle keep-alive connection is closed by the drain only after it was
// idle for IdleGrace.
func TestDrainClosesIdleAfterGrace(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})})
	s.Serve([]net.Listener{l})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	get(t, c, r)
	t0 := time.Now()
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < IdleGrace/2 {
		t.Errorf("the idle connection was closed %s into the drain, want about IdleGrace %s", d, IdleGrace)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("read after the drain = %v, want EOF", err)
	}
}
