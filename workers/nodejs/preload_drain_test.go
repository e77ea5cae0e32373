package nodejs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// conn is a raw HTTP/1.1 client connection to the preload's app, with a
// deadline on every call.
type conn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialApp(t *testing.T, port int) *conn {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(15 * time.Second))
	return &conn{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *conn) send(path string) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		c.t.Fatalf("send GET %s: %v", path, err)
	}
}

func (c *conn) read(path string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("GET %s: no answer: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (c *conn) get(path string) (*http.Response, string) {
	c.t.Helper()
	c.send(path)
	return c.read(path)
}

// line waits for the app's next stdout line and wants it to be want.
func (r *preloadRun) line(t *testing.T, want string) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if r.out.Scan() {
			got <- r.out.Text()
		}
		close(got)
	}()
	select {
	case l := <-got:
		if l != want {
			t.Fatalf("app said %q, want %q", l, want)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("app did not say %q within 15s", want)
	}
}

// A server the app binds to the inherited socket itself, listen({fd: N})
// as socket-activation tutorials write it, is drained as a listen(port)
// one: an in-flight response and one on an idle keep-alive connection after
// the signal get their answers with Connection: close.
func TestPreloadDrainsAnFdListen(t *testing.T) {
	for name, stop := range map[string]string{
		"no handler":   ``,
		"server.close": `process.on('SIGTERM', () => s.close(() => process.exit(0)));`,
	} {
		t.Run(name, func(t *testing.T) {
			r := startPreload(t, `const http = require('http');
const s = http.createServer((req, res) => {
  if (req.url === '/slow') { console.log('slow'); setTimeout(() => res.end('slow'), 500); return; }
  res.end('ok');
});
s.listen({fd: 4}, () => console.log('up'));
`+stop, true)
			r.line(t, "up")
			r.waitCtl(t, "READY=1")
			idle := dialApp(t, r.port)
			if resp, _ := idle.get("/"); resp.Close {
				t.Fatal("Connection: close before the drain")
			}
			slow := dialApp(t, r.port)
			slow.send("/slow")
			r.line(t, "slow")
			r.cmd.Process.Signal(syscall.SIGTERM)
			r.waitCtl(t, "STOPPING=1")
			// What the preload did is the agent's to log, not the app's.
			r.waitCtl(t, "LOG=SIGTERM: draining 2 connections")
			if resp, body := idle.get("/"); body != "ok" || !resp.Close {
				t.Errorf("a request on an idle connection after the signal: %q, Connection: close %v", body, resp.Close)
			}
			if resp, body := slow.read("/slow"); body != "slow" || !resp.Close {
				t.Errorf("in-flight request: %q, Connection: close %v", body, resp.Close)
			}
			if code := r.exit(t); code != 0 {
				t.Errorf("exit %d, want 0", code)
			}
			if strings.Contains(r.errs.String(), "draining") {
				t.Errorf("the preload's drain line went to the app's stderr:\n%s", r.errs.String())
			}
		})
	}
}

// busyApp has a route that keeps the event loop busy for 2 s.
const busyApp = `const http = require('http');
const s = http.createServer((req, res) => {
  if (req.url === '/busy') {
    console.log('busy');
    const end = Date.now() + 2000;
    while (Date.now() < end) {}
    res.end('busy');
    return;
  }
  res.end('ok');
});
s.keepAliveTimeout = Number(process.env.TEST_KEEPALIVE || 5000);
s.listen(Number(process.env.TEST_PORT), () => console.log('up'));
`

// unreadWhileBusy serves one request on two keep-alive connections, runs
// between (after the signal, or nothing) then keeps the loop busy with one
// while the other sends a request, and wants both answered.
func unreadWhileBusy(t *testing.T, r *preloadRun, between func()) (idleResp *http.Response, idleBody string) {
	t.Helper()
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	idle, busy := dialApp(t, r.port), dialApp(t, r.port)
	idle.get("/")
	busy.get("/")
	between()
	busy.send("/busy")
	r.line(t, "busy")
	idle.send("/") // waits unread in the socket: the loop is busy
	if _, body := busy.read("/busy"); body != "busy" {
		t.Errorf("busy route: %q", body)
	}
	return idle.read("/")
}

// A request that waits unread in its socket while the event loop is busy
// (a CPU-bound route) is answered, although its keep-alive connection had
// been idle for longer than the drain's grace when the loop got a turn:
// the drain closes a connection only once a loop turn read nothing from it.
func TestPreloadDrainKeepsARequestABusyLoopLeftUnread(t *testing.T) {
	r := startPreload(t, busyApp, true)
	resp, body := unreadWhileBusy(t, r, func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		r.waitCtl(t, "STOPPING=1")
	})
	if body != "ok" || !resp.Close {
		t.Errorf("the request sent while the loop was busy: %q, Connection: close %v", body, resp.Close)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// The same for node's own keepAliveTimeout (300 ms + node's 1 s buffer),
// which fires before the busy loop reads the waiting request.
func TestPreloadKeepAliveTimeoutKeepsARequestABusyLoopLeftUnread(t *testing.T) {
	r := startPreloadEnv(t, busyApp, []string{"TEST_KEEPALIVE=300"})
	if _, body := unreadWhileBusy(t, r, func() {}); body != "ok" {
		t.Errorf("the request sent while the loop was busy: %q", body)
	}
}

// An event stream still open at the stop signal is ended after a short
// grace (its client reconnects, to a new worker), and so is a WebSocket,
// with a close frame 1001 (going away); then node exits.
func TestPreloadEndsLongLivedResponses(t *testing.T) {
	r := startPreload(t, `const http = require('http');
const s = http.createServer((req, res) => {
  res.writeHead(200, {'content-type': 'text/event-stream'});
  res.write('data: hello\n\n');
});
s.on('upgrade', (req, sock) => {
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
});
s.listen({fd: 4}, () => console.log('up'));
`, true)
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	sse := dialApp(t, r.port)
	sse.send("/events")
	resp, err := http.ReadResponse(sse.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("data: hello\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("first event: %v", err)
	}
	ws := dialApp(t, r.port)
	fmt.Fprintf(ws.c, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	up, err := http.ReadResponse(ws.br, nil)
	if err != nil || up.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", up, err)
	}
	late := dialApp(t, r.port) // accepted now, its request comes after the first pass
	t0 := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Errorf("event stream after the signal: %q %v, want its clean end", rest, err)
	}
	// Its connection ends with it: a client reconnecting over it would
	// start its next stream on this draining worker.
	fmt.Fprintf(sse.c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	if again, err := http.ReadResponse(sse.br, nil); err == nil {
		t.Errorf("a reconnect over the ended event stream's connection got %s from the draining worker, want the connection's end", again.Status)
	}
	sse.c.Close()
	// A stream that begins after the first pass ends too, a grace later.
	late.send("/events")
	lresp, err := http.ReadResponse(late.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(lresp.Body); err != nil || string(rest) != "data: hello\n\n" {
		t.Errorf("an event stream begun while draining: %q %v, want its first event, then its clean end", rest, err)
	}
	late.c.Close()
	frame, err := io.ReadAll(ws.br)
	want := append([]byte{0x88, 12, 0x03, 0xe9}, "going away"...)
	if string(frame) != string(want) {
		t.Errorf("WebSocket after the signal: % x (%v), want a close frame 1001 % x", frame, err, want)
	}
	ws.c.Close()
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("long-lived responses ended %v after the signal, want about a second", d)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// A cluster-module app takes its worker branch: it serves in this process,
// forks no child, sees itself as worker DEPLOYD_WORKER+1, and a message to
// the primary does not crash it. As CommonJS with isMaster (the old name)
// and as an ES module with isPrimary.
func TestPreloadClusterAppTakesItsWorkerBranch(t *testing.T) {
	const body = `
if (cluster.%s) {
  for (let i = 0; i < 2; i++) cluster.fork();
  console.log('primary');
} else {
  http.createServer((req, res) => res.end('ok')).listen(Number(process.env.TEST_PORT), () => {
    cluster.worker.send({hello: 1});
    process.send({hello: 2});
    console.log('worker ' + cluster.worker.id + ' ' + cluster.isWorker + ' ' + cluster.isPrimary);
  });
}
`
	for name, app := range map[string]struct{ file, js string }{
		"commonjs isMaster": {"app.js", `const cluster = require('cluster'), http = require('http');` + fmt.Sprintf(body, "isMaster")},
		"esm isPrimary":     {"app.mjs", `import cluster from 'node:cluster'; import http from 'node:http';` + fmt.Sprintf(body, "isPrimary")},
	} {
		t.Run(name, func(t *testing.T) {
			r := startPreloadFile(t, app.file, app.js, []string{"DEPLOYD_WORKER=1"})
			r.line(t, "worker 2 true false")
			r.waitCtl(t, "READY=1")
			if kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", r.cmd.Process.Pid, r.cmd.Process.Pid)); err != nil || len(bytes.TrimSpace(kids)) != 0 {
				t.Errorf("the worker has children %q (%v), want none", kids, err)
			}
			c := dialApp(t, r.port)
			if _, body := c.get("/"); body != "ok" {
				t.Errorf("GET /: %q", body)
			}
			r.cmd.Process.Signal(syscall.SIGTERM)
			if code := r.exit(t); code != 0 {
				t.Errorf("exit %d, want 0", code)
			}
		})
	}
}

// A server on an address deployd does not manage is left alone (and
// NODE_DEBUG=deployd says so), and a plain net.Server on an inherited
// listener gets a warning at start that names it and the fix.
func TestPreloadLeavesOtherServersAloneAndWarnsOfPlainOnes(t *testing.T) {
	r := startPreloadEnv(t, `const http = require('http'), net = require('net');
const other = http.createServer((req, res) => res.end('other'));
other.listen(0, '127.0.0.1', () => {
  const s = net.createServer((c) => c.end('HTTP/1.0 200 OK\r\n\r\nok'));
  s.listen({fd: 4}, () => console.log('up'));
});
`, []string{"NODE_DEBUG=deployd"})
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	// stderr comes through its own pipe: it may arrive after READY=1.
	for _, want := range []string{
		`is not on a listener of app "web": left alone (no drain)`,
		`deployd: warning: a Server that is not an HTTP server accepts on tcp://127.0.0.1:` + strconv.Itoa(r.port) + ` of app "web"`,
		`end them yourself on SIGTERM`,
	} {
		r.errLine(t, want)
	}
}

// errLine waits up to 10 s for want in node's stderr.
func (r *preloadRun) errLine(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.errs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr lacks %q after 10s:\n%s", want, r.errs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Plain HTTP/2 (h2c, http2.createServer) on the inherited fd drains as the
// secure one does: the next request on an open session after the signal
// is served on it, then node exits 0.
func TestPreloadDrainsAPlainHTTP2Session(t *testing.T) {
	r := startPreload(t, `const http2 = require('http2');
const s = http2.createServer();
s.on('stream', (stream) => { stream.respond({':status': 200}); stream.end('ok'); });
s.listen({fd: 4}, () => console.log('up'));
`, true)
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var conns []string
	get := func() string {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn.LocalAddr().String()) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", fmt.Sprintf("http://127.0.0.1:%d/", r.port), nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		defer resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("GET: %s, want HTTP/2", resp.Proto)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	get()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if body := get(); body != "ok" {
		t.Errorf("a request on the open session after the signal: %q", body)
	}
	if len(conns) != 2 || conns[0] != conns[1] {
		t.Errorf("connections used: %q, want the one session twice", conns)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}
