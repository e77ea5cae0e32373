package nodejs

import (
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// idleApp answers every request with "ok"; its keep-alive timeout
// (node's own idle close) is TEST_KEEPALIVE ms.
const idleApp = `const http = require('http');
const s = http.createServer((req, res) => res.end('ok'));
s.keepAliveTimeout = Number(process.env.TEST_KEEPALIVE);
s.listen(Number(process.env.TEST_PORT), () => console.log('up'));
`

// closedByPeer waits up to d for the server's FIN (or reset) to reach c,
// which reads nothing meanwhile: its TCP state leaves ESTABLISHED. It
// reports whether it did.
func closedByPeer(t *testing.T, c *conn, d time.Duration) bool {
	t.Helper()
	raw, err := c.c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var info *unix.TCPInfo
		var gerr error
		if err := raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
			t.Fatalf("TCP_INFO: %v %v", err, gerr)
		}
		if info.State != unix.BPF_TCP_ESTABLISHED {
			return true
		}
	}
	return false
}

// A client that reuses its kept-alive connection at the moment the drain
// would close it loses its request: closing an idle HTTP/1 connection
// races the client's next request (it may pick the connection from its
// pool before it reads the FIN), and no server can win that race. So the
// drain closes no idle connection sooner than the app itself would (its
// keepAliveTimeout, here 60 s) before the drain's last call: a client held
// up for seconds (a busy machine) still gets its answer, with
// Connection: close. The client here sends its request as soon as a FIN
// reaches it (the moment a racing client's request would be lost), or
// after 3 s, three times the grace after which the drain used to close.
func TestPreloadDrainLeavesAnIdleConnectionToItsClient(t *testing.T) {
	r := startPreloadEnv(t, idleApp, []string{"TEST_KEEPALIVE=60000"})
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	c := dialApp(t, r.port)
	if resp, body := c.get("/"); body != "ok" || resp.Close {
		t.Fatalf("before the drain: %q, Connection: close %v", body, resp.Close)
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if closedByPeer(t, c, 3*time.Second) {
		t.Error("the drain closed a kept-alive connection that had been idle for less than the app's keepAliveTimeout")
	}
	c.send("/")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("a request on the idle connection during the drain got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ok" || !resp.Close {
		t.Errorf("a request on the idle connection during the drain: %q, Connection: close %v", body, resp.Close)
	}
	c.c.Close() // as a client does after a Connection: close answer
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// An idle connection whose client never comes back holds the drain only
// until its last call, a little before stop_timeout (10 s here), when the
// drain closes it once no byte waits in it; node then exits 0, not at
// stop_timeout. The app has no keep-alive timeout of its own.
func TestPreloadDrainClosesIdleConnectionsAtItsLastCall(t *testing.T) {
	r := startPreloadEnv(t, idleApp, []string{"TEST_KEEPALIVE=0"})
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	c := dialApp(t, r.port)
	c.get("/")
	t0 := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if !closedByPeer(t, c, 10*time.Second) {
		t.Fatal("the idle connection was not closed within stop_timeout")
	}
	if d := time.Since(t0); d < 5*time.Second {
		t.Errorf("the idle connection was closed %v after the signal, want at the drain's last call (8 s)", d)
	}
	c.c.Close() // as a client does when it reads the FIN
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// The app's own keepAliveTimeout (500 ms here) still closes an idle
// connection during the drain, long before the last call: a drain lasts
// no longer than the app's keep-alive policy lets its idle clients stay.
func TestPreloadDrainKeepsTheAppsKeepAliveTimeout(t *testing.T) {
	r := startPreloadEnv(t, idleApp, []string{"TEST_KEEPALIVE=500"})
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	c := dialApp(t, r.port)
	c.get("/")
	t0 := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if !closedByPeer(t, c, 10*time.Second) {
		t.Fatal("the idle connection was not closed within stop_timeout")
	}
	if d := time.Since(t0); d > 6*time.Second {
		t.Errorf("the idle connection was closed %v after the signal, want at the app's keepAliveTimeout (0.5 s + node's buffer)", d)
	}
	c.c.Close()
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}
