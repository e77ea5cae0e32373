package control

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
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
	c := newControlServer(h, nil, nil, hclog.NewNullLogger())
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

// TestControlStopAnswersAcceptedConnections: a connection the agent
// accepted before it began to stop, whose request arrives after, gets an
// answer: "stopping, ask again", without the request being run (after a
// handoff this agent must not act). With http.Server.Shutdown alone it got
// EOF (net/http closes a connection whose request it reads after Shutdown
// began): during a handoff, a client saw the old agent hang up although the
// new one was serving.
func TestControlStopAnswersAcceptedConnections(t *testing.T) {
	var ran atomic.Bool
	c, ln, path := startControl(t, func(w http.ResponseWriter, _ *http.Request) {
		ran.Store(true)
		_, _ = io.WriteString(w, "ran")
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

	if _, err := io.WriteString(conn, "POST /v1/reload HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the connection accepted before the stop got no answer: %v", err)
	}
	var e api.Error
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(api.StoppingHeader) == "" || e.Kind != api.KindStopping || !resp.Close {
		t.Errorf("answer %d, %s %q, kind %q, Connection: close %v; want 503 stopping, closed",
			resp.StatusCode, api.StoppingHeader, resp.Header.Get(api.StoppingHeader), e.Kind, resp.Close)
	}
	if ran.Load() {
		t.Error("a request that arrived after the stop began was run")
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not return once the connection was answered")
	}
}

// TestControlStopFinishesRequestsInFlight: a request whose handler runs
// when the stop begins gets its real answer, and the stop waits for it.
func TestControlStopFinishesRequestsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	c, ln, path := startControl(t, func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
	})
	type result struct {
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		resp, err := client.Post("http://agent/v1/reload", "application/json", strings.NewReader("{}"))
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{string(b), err}
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { c.stop(ln); close(stopped) }()
	<-c.stopping.Done()
	select {
	case <-stopped:
		t.Fatal("stop returned while a request was in flight")
	default:
	}
	close(release)
	if r := <-got; r.err != nil || r.body != "done" {
		t.Fatalf("the request in flight got %q, %v; want its answer", r.body, r.err)
	}
	<-stopped
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
