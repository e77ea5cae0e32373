package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
