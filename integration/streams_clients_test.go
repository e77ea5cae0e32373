package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamSession is one stream a client held: the pid of the worker that
// served it (0 when it never got its first event), whether it ended
// cleanly, and how; ended is "" while it is open, or when the test ended
// it.
type streamSession struct {
	pid   int
	clean bool
	ended string
}

// streamClients keeps Server-Sent-Events and WebSocket clients connected
// to an app: a client whose stream ends connects again, until stop, and
// every stream it held is recorded. Every client is bounded by the
// context of startStreams.
type streamClients struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	tr     *http.Transport

	mu       sync.Mutex
	sessions map[string][]streamSession // client ("sse 3", "ws 7") -> its streams in order
}

// startStreams starts sse event-stream clients on /events and ws
// WebSocket clients on / of the app on port, for d at most. The app
// sends "pid=PID" first on each (SSE: as the data of the first event).
func startStreams(t *testing.T, port, sse, ws int, d time.Duration) *streamClients {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	c := &streamClients{ctx: ctx, cancel: cancel, tr: &http.Transport{DisableCompression: true},
		sessions: map[string][]streamSession{}}
	hc := &http.Client{Transport: c.tr}
	url, addr := fmt.Sprintf("http://127.0.0.1:%d/events", port), fmt.Sprintf("127.0.0.1:%d", port)
	for i := range sse {
		c.run(fmt.Sprintf("sse %d", i), func(opened func(int)) (bool, string) { return sseStream(ctx, hc, url, opened) })
	}
	for i := range ws {
		c.run(fmt.Sprintf("ws %d", i), func(opened func(int)) (bool, string) { return wsStream(ctx, addr, opened) })
	}
	t.Cleanup(c.stop)
	return c
}

// run keeps one client connected with stream, which calls opened with
// the worker's pid once the stream got its first message, and returns
// whether it ended cleanly, and how.
func (c *streamClients) run(name string, stream func(opened func(pid int)) (clean bool, how string)) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for c.ctx.Err() == nil {
			idx := -1
			clean, how := stream(func(pid int) {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.sessions[name] = append(c.sessions[name], streamSession{pid: pid})
				idx = len(c.sessions[name]) - 1
			})
			c.mu.Lock()
			switch {
			case c.ctx.Err() != nil: // the test ended it
			case idx < 0:
				c.sessions[name] = append(c.sessions[name], streamSession{ended: how})
			default:
				c.sessions[name][idx].clean, c.sessions[name][idx].ended = clean, how
			}
			c.mu.Unlock()
			select { // pace reconnects after an error
			case <-c.ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// current returns, per client, the pid of the stream it holds now (0 when
// none is open).
func (c *streamClients) current() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for name, ss := range c.sessions {
		if last := ss[len(ss)-1]; last.ended == "" {
			out[name] = last.pid
		} else {
			out[name] = 0
		}
	}
	return out
}

// all returns every client's streams so far.
func (c *streamClients) all() map[string][]streamSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]streamSession{}
	for name, ss := range c.sessions {
		out[name] = append([]streamSession(nil), ss...)
	}
	return out
}

func (c *streamClients) stop() {
	c.cancel()
	c.wg.Wait()
	c.tr.CloseIdleConnections()
}

// sseStream reads one event stream until it ends. A clean end is the end
// of the chunked response; a reset or a truncated body is not.
func sseStream(ctx context.Context, hc *http.Client, url string, opened func(int)) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, fmt.Sprintf("request: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("status %d", resp.StatusCode)
	}
	pid := 0
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		switch {
		case err == nil:
		case pid == 0:
			return false, fmt.Sprintf("ended before its first event: %v", err)
		case err == io.EOF:
			return true, "response ended"
		default:
			return false, fmt.Sprintf("response cut: %v", err)
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "data: pid="); ok && pid == 0 {
			pid, _ = strconv.Atoi(v)
			opened(pid)
		}
	}
}

// wsStream holds one WebSocket (a minimal RFC 6455 client: small
// unmasked server frames) until the server closes it. A clean end is a
// close frame 1001 "going away", answered, then the end of the
// connection.
func wsStream(ctx context.Context, addr string, opened func(int)) (bool, string) {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, fmt.Sprintf("dial: %v", err)
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	var k [16]byte
	rand.Read(k[:])
	key := base64.StdEncoding.EncodeToString(k[:])
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n\r\n", addr, key)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false, fmt.Sprintf("upgrade: %v", err)
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.StatusCode != http.StatusSwitchingProtocols ||
		resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		return false, fmt.Sprintf("upgrade: status %d, accept %q", resp.StatusCode, resp.Header.Get("Sec-WebSocket-Accept"))
	}
	pid := 0
	for {
		op, payload, err := wsFrame(br)
		switch {
		case err != nil && pid == 0:
			return false, fmt.Sprintf("ended before its first message: %v", err)
		case err != nil:
			return false, fmt.Sprintf("cut without a close frame: %v", err)
		case op == 1 && pid == 0:
			pid, _ = strconv.Atoi(strings.TrimPrefix(string(payload), "pid="))
			opened(pid)
		case op == 9: // ping
			wsWrite(conn, 10, payload)
		case op == 8:
			code := 0
			if len(payload) >= 2 {
				code = int(binary.BigEndian.Uint16(payload))
			}
			// Answer the close (RFC 6455 5.5.1); the server then ends the
			// connection.
			wsWrite(conn, 8, payload[:min(2, len(payload))])
			_, err := br.ReadByte()
			if code != 1001 {
				return false, fmt.Sprintf("close frame %d %q", code, payload[min(2, len(payload)):])
			}
			if err != io.EOF {
				return false, fmt.Sprintf("close frame 1001, then %v instead of the end of the connection", err)
			}
			return true, "close frame 1001"
		}
	}
}

// wsWrite writes a masked client frame of less than 126 bytes.
func wsWrite(w io.Writer, op byte, payload []byte) error {
	var mask [4]byte
	rand.Read(mask[:])
	b := append([]byte{0x80 | op, 0x80 | byte(len(payload))}, mask[:]...)
	for i, p := range payload {
		b = append(b, p^mask[i%4])
	}
	_, err := w.Write(b)
	return err
}
