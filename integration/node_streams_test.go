package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// streamsApp holds an event stream and a WebSocket (the ws library) open
// until the client goes.
const streamsApp = `const express = require('express')
const { WebSocketServer } = require('ws')
const app = express()

app.get('/events', (req, res) => {
  res.set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' })
  res.flushHeaders()
  res.write('data: ' + process.pid + '\n\n')
})

const server = app.listen(3000, () => {
  console.log('Example app listening on port 3000')
})
const wss = new WebSocketServer({ server })
wss.on('connection', (ws) => ws.send(String(process.pid)))
`

// wsFrame reads one unmasked server frame of less than 126 bytes.
func wsFrame(br *bufio.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	if h[1]&0x80 != 0 || h[1]&0x7f >= 126 {
		return 0, nil, fmt.Errorf("unexpected frame header % x", h)
	}
	payload = make([]byte, h[1]&0x7f)
	_, err = io.ReadFull(br, payload)
	return h[0] & 0x0f, payload, err
}

// linkNodeModule makes the fixtures' module available to the app in dir
// (made by nodeApp) as node_modules/module.
func linkNodeModule(t *testing.T, dir, module string) {
	t.Helper()
	if err := os.Symlink(filepath.Join(nodeFixtures(t), "node_modules", module), filepath.Join(dir, "node_modules", module)); err != nil {
		t.Fatal(err)
	}
}

// An event stream and a WebSocket open on the old worker end cleanly soon
// after its stop signal, well before stop_timeout (30 s): the stream's
// body ends, the WebSocket gets a close frame 1001 "going away", and the
// reload is done without waiting for them.
func TestNodeReloadEndsLongLivedStreams(t *testing.T) {
	parallel(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": streamsApp})
	linkNodeModule(t, dir, "ws")
	cfg := strings.Replace(nodeConfig(dir, []string{"node", "app.js"}, port, 1, ""), `stop_timeout = "15s"`, `stop_timeout = "30s"`, 1)
	a := StartAgent(t, bins, cfg)
	a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(60 * time.Second))
		return c, bufio.NewReader(c)
	}
	sse, sseR := dial()
	fmt.Fprintf(sse, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(sseR, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first event %q: %v", first, err)
	}
	ws, wsR := dial()
	fmt.Fprintf(ws, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	if up, err := http.ReadResponse(wsR, nil); err != nil || up.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", up, err)
	}
	if op, pid, err := wsFrame(wsR); err != nil || op != 1 || strings.TrimSpace(first) != "data: "+string(pid) {
		t.Fatalf("first message: op %d %q %v (the event stream said %q)", op, pid, err, first)
	}

	t0 := time.Now()
	sseDone, wsDone := make(chan string, 1), make(chan string, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		sseDone <- fmt.Sprintf("%v after %v", err, time.Since(t0).Round(100*time.Millisecond))
	}()
	go func() {
		op, p, err := wsFrame(wsR)
		ws.Close()
		wsDone <- fmt.Sprintf("op %d payload %q %v after %v", op, p, err, time.Since(t0).Round(100*time.Millisecond))
	}()
	r := a.CLI("reload", "web")
	took := time.Since(t0)
	if r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
	}
	for name, ch := range map[string]chan string{"event stream": sseDone, "WebSocket": wsDone} {
		select {
		case got := <-ch:
			t.Logf("%s: %s", name, got)
			if name == "event stream" && !strings.HasPrefix(got, "<nil> ") {
				t.Errorf("the event stream did not end cleanly: %s", got)
			}
			if name == "WebSocket" && !strings.HasPrefix(got, `op 8 payload "\x03\xe9going away" <nil>`) {
				t.Errorf("the WebSocket got no close frame 1001: %s", got)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s still open 30 s after the reload began", name)
		}
	}
	t.Logf("reload took %v", took)
	if took > 25*time.Second {
		t.Errorf("the reload took %v: the old worker waited for its streams (stop_timeout 30 s)", took)
	}
}
