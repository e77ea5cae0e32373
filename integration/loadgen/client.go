package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"syscall"
	"time"
)

// maxBody bounds how much of a response body is read and checked.
const maxBody = 1 << 20

// client sends one request at a time over its own transport, so with KeepAlive each
// client holds exactly one connection. Owned by the goroutine running run.
type client struct {
	o      Options
	http   *http.Client
	rec    *recorder
	id     int
	source string
}

func newClient(o Options, rec *recorder, id int) *client {
	dialer := &net.Dialer{Timeout: o.Timeout, Control: dialLoopbackOnly}
	source := ""
	if len(o.Sources) > 0 {
		source = o.Sources[id%len(o.Sources)]
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	tr := &http.Transport{
		Proxy:               nil, // never a proxy from the environment
		DialContext:         dialer.DialContext,
		DisableKeepAlives:   !o.KeepAlive,
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // Check sees the body as the server sent it
		TLSClientConfig:     o.TLS,
		ForceAttemptHTTP2:   o.HTTP2,
	}
	return &client{
		o:      o,
		rec:    rec,
		id:     id,
		source: source,
		http: &http.Client{
			Transport: tr,
			// A redirect is a response to check, not something to follow.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// dialLoopbackOnly is the dialer's last check, on the resolved address.
func dialLoopbackOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil || !isLoopbackIP(host) {
		return fmt.Errorf("%w: dial %s", ErrNotLoopback, address)
	}
	return nil
}

func (c *client) run(ctx context.Context, b *bounds) {
	defer c.http.CloseIdleConnections()
	for b.next(ctx) {
		s := c.do(ctx)
		c.rec.record(s)
		if c.o.Observe != nil && !s.aborted {
			c.o.Observe(Observation{Client: c.id, Source: c.source, Sent: s.sent, Got: s.got,
				Reused: s.reused, Body: s.body, Err: s.err})
		}
	}
}

// sample is the outcome of one request.
type sample struct {
	aborted     bool // ended by ctx: not counted
	gotResponse bool // latency is valid
	latency     time.Duration
	version     string
	err         error // nil: the response passed Check
	connect     bool  // err is a connect error
	refused     bool  // err is a refused connection (ECONNREFUSED)
	retried     bool  // the transport used more than one connection: counted as a failure
	// For Options.Observe: when it was sent and answered (zero: no answer), whether its
	// connection was reused, and the body's start.
	sent, got time.Time
	reused    bool
	body      string
}

func (c *client) do(ctx context.Context) sample {
	rctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	// Trace callbacks may run on the transport's goroutines. GotConn runs once per
	// attempt: more than once means the transport retried the request on a new
	// connection after the reused one failed, which a load generator must not hide.
	var fresh, firstByte atomic.Bool
	var conns atomic.Int32
	trace := &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			conns.Add(1)
			fresh.Store(!i.Reused)
		},
		GotFirstResponseByte: func() { firstByte.Store(true) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(rctx, trace), http.MethodGet, c.o.URL, nil)
	if err != nil {
		return sample{err: err}
	}
	t0 := time.Now()
	resp, err := c.http.Do(req)
	retried := conns.Load() > 1
	if err != nil {
		if ctx.Err() != nil {
			return sample{aborted: true}
		}
		return sample{err: err, retried: retried, connect: isConnectError(err, fresh.Load(), firstByte.Load()),
			refused: errors.Is(err, syscall.ECONNREFUSED), sent: t0, reused: !fresh.Load()}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	got := time.Now()
	s := sample{gotResponse: true, latency: got.Sub(t0), version: versionOf(body), retried: retried,
		sent: t0, got: got, reused: !fresh.Load(), body: string(body[:min(len(body), 200)])}
	switch {
	case err != nil && ctx.Err() != nil:
		return sample{aborted: true}
	case err != nil:
		s.err = fmt.Errorf("read body: %w", err)
	case retried:
		s.err = fmt.Errorf("%w (%d connections for one request)", ErrRetried, conns.Load())
	default:
		s.err = c.o.Check(resp.StatusCode, body)
	}
	return s
}

// ErrRetried is the failure recorded for a request that Go's transport sent again on a
// new connection because the reused one failed before any response byte (it does so
// silently for idempotent requests): a client without that retry would have failed.
var ErrRetried = errors.New("the reused connection failed and the transport retried the request")

// isConnectError tells a connection refused or reset before the server answered: a
// refused or reset dial, or a reset of a new connection before any response byte — what
// a client sees when its connection was still in the accept queue of a listener that got
// closed. Other dial errors (a timeout, no local port left) are plain failures.
func isConnectError(err error, fresh, firstByte bool) bool {
	refusedOrReset := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return refusedOrReset
	}
	return fresh && !firstByte && errors.Is(err, syscall.ECONNRESET)
}

// versionOf returns X from a body starting with "version=X" followed by a space or the
// end of a line, or "".
func versionOf(body []byte) string {
	rest, ok := bytes.CutPrefix(body, []byte("version="))
	if !ok {
		return ""
	}
	if i := bytes.IndexAny(rest, " \r\n"); i >= 0 {
		rest = rest[:i]
	}
	return string(rest)
}
