package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// socketIOApp is a Socket.IO 4 server as its docs write one: listen(PORT),
// no cluster adapter; it echoes "echo" events.
const socketIOApp = `const http = require('http');
const { Server } = require('socket.io');
const srv = http.createServer();
const io = new Server(srv);
io.on('connection', (s) => { s.on('echo', (m) => s.emit('echo', m)); });
srv.listen(3000);
`

// socketIOSession runs one Socket.IO session over HTTP long-polling from
// source address src, a new connection per request (as browsers behind
// their own pools may): handshake, namespace connect, an echo. A request
// that reaches another worker than the session's gets 400 "Session ID
// unknown".
func socketIOSession(src string, port int) error {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
	base := fmt.Sprintf("http://127.0.0.1:%d/socket.io/?EIO=4&transport=polling", port)
	do := func(method, url, body string) (string, error) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "text/plain;charset=UTF-8")
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: status %d: %s", method, resp.StatusCode, strings.TrimSpace(string(b)))
		}
		return string(b), err
	}
	open, err := do("GET", base, "")
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	var hs struct{ Sid string }
	if !strings.HasPrefix(open, "0") || json.Unmarshal([]byte(open[1:]), &hs) != nil || hs.Sid == "" {
		return fmt.Errorf("handshake: unexpected %q", open)
	}
	url := base + "&sid=" + hs.Sid
	steps := []struct{ method, body, want string }{
		{"POST", "40", "ok"},
		{"GET", "", "40"},
		{"POST", `42["echo","hi ` + src + `"]`, "ok"},
		{"GET", "", `42["echo","hi ` + src + `"]`},
	}
	for _, s := range steps {
		got, err := do(s.method, url, s.body)
		if err != nil {
			return err
		}
		if !strings.Contains(got, s.want) {
			return fmt.Errorf("%s: got %q, want %q", s.method, got, s.want)
		}
	}
	return nil
}

// socketIOSessions runs 2 sessions from each of 20 client addresses, 8 at
// a time, and returns the failures.
func socketIOSessions(port int) []error {
	var mu sync.Mutex
	var failed []error
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for src := range work {
				if err := socketIOSession(src, port); err != nil {
					mu.Lock()
					failed = append(failed, fmt.Errorf("%s: %w", src, err))
					mu.Unlock()
				}
			}
		}()
	}
	for range 2 {
		for c := 2; c < 22; c++ {
			work <- fmt.Sprintf("127.0.0.%d", c)
		}
	}
	close(work)
	wg.Wait()
	return failed
}

// TestSocketIOPollingNeedsSticky: an unmodified Socket.IO 4 app with 4
// workers, clients on the long-polling transport from 20 addresses: with
// balance = "sticky" no session fails, before and after a reload; with
// "shared" the failures are counted beside it.
func TestSocketIOPollingNeedsSticky(t *testing.T) {
	needSteering(t)
	const sessions = 40
	rate := map[string]int{}
	for _, balance := range []string{"shared", "sticky"} {
		port := FreePort(t)
		dir := nodeApp(t, "socket.io", port, map[string]string{"app.js": socketIOApp})
		a := StartAgent(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, 4, fmt.Sprintf("balance = %q", balance)))
		a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 4) })
		failed := socketIOSessions(port)
		rate[balance] = len(failed)
		if balance == "sticky" {
			if len(failed) > 0 {
				t.Fatalf("sticky: %d of %d sessions failed: %v", len(failed), sessions, failed[:min(3, len(failed))])
			}
			if r := a.CLI("reload", "web"); r.Code != 0 {
				t.Fatalf("reload: exit %d\n%s", r.Code, r.Stderr)
			}
			if failed := socketIOSessions(port); len(failed) > 0 {
				t.Fatalf("sticky, after a reload: %d of %d sessions failed: %v", len(failed), sessions, failed[:min(3, len(failed))])
			}
		} else if len(failed) > 0 {
			t.Logf("shared: e.g. %v", failed[0])
		}
		a.Stop()
	}
	t.Logf("failed Socket.IO polling sessions of %d (4 workers): shared %d, sticky 0 (and 0 after a reload)", sessions, rate["shared"])
}
