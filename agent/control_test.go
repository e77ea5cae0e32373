package agent

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// waitFor polls cond, which the code under test makes true, for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func startControl(t *testing.T, h http.HandlerFunc) (*controlServer, net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := newControlServer(h, nil, hclog.NewNullLogger())
	served := make(chan error, 1)
	go func() { served <- c.serve(ln) }()
	t.Cleanup(func() {
		c.stop(ln)
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return c, ln, path
}

// TestControlStopAnswersAcceptedRequests: a connection the agent accepted
// before it began to stop, whose request arrives after, gets its answer.
// With http.Server.Shutdown alone it got EOF (net/http closes a connection
// whose request it reads after Shutdown began): during a handoff, a client
// saw the old agent hang up although the new one was serving.
func TestControlStopAnswersAcceptedRequests(t *testing.T) {
	c, ln, path := startControl(t, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "answered")
	})
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "the server to accept the connection", func() bool { return c.conns.count() == 1 })

	stopped := make(chan struct{})
	go func() { c.stop(ln); close(stopped) }()
	<-c.stopping.Done()
	select {
	case <-c.served: // no longer accepting
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after stop began")
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("a stopping server still accepts connections")
	}

	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the request accepted before the stop got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "answered" || !resp.Close {
		t.Errorf("answer %d %q, Connection: close %v; want 200 \"answered\", closed", resp.StatusCode, body, resp.Close)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not return once the connection was answered")
	}
}

// TestControlStopEndsStreams: a handler streaming on controlStopping ends
// when the stop begins, and the stop does not wait for its bound.
func TestControlStopEndsStreams(t *testing.T) {
	started := make(chan struct{})
	var c *controlServer
	c, ln, path := startControl(t, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		stop := context.AfterFunc(c.stopping, cancel)
		defer stop()
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		close(started)
		<-ctx.Done()
	})
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := client.Get("http://agent/follow")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	begin := time.Now()
	c.stop(ln)
	if d := time.Since(begin); d > controlStopTimeout/2 {
		t.Errorf("stop took %v with a stream open; the stream should end at once", d)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Errorf("the stream did not end cleanly: %v", err)
	}
}
