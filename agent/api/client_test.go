package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// closeFirst answers the control API's version on a unix socket, but
// closes its first connection unanswered, as an agent handing off may.
func closeFirst(t *testing.T) (socket string, conns *atomic.Int32) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "deployd.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			first := conns.Add(1) == 1
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil || first {
					return // the request arrived; no answer comes
				}
				b, _ := json.Marshal(VersionInfo{Version: "test", PID: 42})
				resp := &http.Response{StatusCode: 200, ProtoMajor: 1, ProtoMinor: 1, ContentLength: int64(len(b)),
					Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(b)), Close: true}
				_ = resp.Write(c)
			}()
		}
	}()
	return socket, conns
}

func TestReadOnlyRequestAskedAgainAfterAnUnansweredConnection(t *testing.T) {
	socket, conns := closeFirst(t)
	v, err := NewClient(socket).Version(context.Background())
	if err != nil {
		t.Fatalf("version after one connection closed unanswered: %v", err)
	}
	if v.PID != 42 || conns.Load() != 2 {
		t.Errorf("got pid %d over %d connections, want 42 over 2", v.PID, conns.Load())
	}
}

// TestStoppingAgentAskedAgain: an agent that answers "stopping" (it did
// nothing: agent/control/server.go) is asked once more, body and all, and the
// second answer counts; a second "stopping" is the answer.
func TestStoppingAgentAskedAgain(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "deployd.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var stopAlways atomic.Bool
	bodies := make(chan string, 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- r.Method + " " + string(b)
		if calls.Add(1) == 1 || stopAlways.Load() {
			w.Header().Set(StoppingHeader, "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(Error{Kind: KindStopping, Error: "stopping"})
			return
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := NewClient(socket)
	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown after one stopping answer: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
	first, second := <-bodies, <-bodies
	if first != second || first[:4] != "POST" {
		t.Errorf("first request %q, second %q: want the same POST twice", first, second)
	}

	stopAlways.Store(true)
	err = c.Shutdown(context.Background())
	var se *StatusError
	if !errors.As(err, &se) || se.Kind != KindStopping || se.Kind.ExitCode() != ExitUnreachable {
		t.Fatalf("two stopping answers gave %v; want a stopping StatusError (exit %d)", err, ExitUnreachable)
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("%d requests in all, want 4 (asked once more, not more)", n)
	}
}
