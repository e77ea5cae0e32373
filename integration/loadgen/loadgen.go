// Package loadgen is a bounded HTTP load generator for deployd's integration tests and
// benchmarks: concurrent clients send GETs to one loopback URL, check every response and
// record latencies until a request count, a duration or the context ends the run.
//
// It only ever connects to loopback addresses: Run and Start refuse any other URL, and the
// dialer refuses any address that is not loopback (so neither DNS nor a redirect can send
// traffic elsewhere).
package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotLoopback is returned for a target that is not a loopback address.
var ErrNotLoopback = errors.New("loadgen: target is not a loopback address")

// Options describe one load run. With KeepAlive false every request leaves a client port
// in TIME_WAIT for a minute: at thousands of requests per second for more than a few
// seconds the local ports run out (dial errors, counted as Failures only).
type Options struct {
	URL         string        // e.g. http://127.0.0.1:18080/; host must be a loopback IP or localhost
	Clients     int           // concurrent clients (>= 1), each sending one request at a time
	KeepAlive   bool          // false = one connection per request
	MaxRequests int           // total bound over all clients (required > 0)
	MaxDuration time.Duration // time bound (required > 0)
	Timeout     time.Duration // per request; default 10s
	// TLS configures https URLs (a test's self-signed certificate); HTTP2
	// makes the clients speak HTTP/2 over it (with KeepAlive, each client
	// keeps one session open).
	TLS   *tls.Config
	HTTP2 bool
	// Check judges every response; the default wants status 200 and a body starting with
	// "version=". It is called concurrently from all clients.
	Check func(status int, body []byte) error
	// Sources, when set, are loopback addresses the clients connect from, client i from
	// Sources[i % len(Sources)] (kernel steering tells sticky clients by address).
	Sources []string
	// Observe, when set, gets every counted request as it ends, for a test that needs to
	// know when each was sent and who answered. It is called concurrently from all clients.
	Observe func(Observation)
}

// Observation is one counted request, for Options.Observe.
type Observation struct {
	Client int       // 0 .. Clients-1
	Source string    // its Sources address, "" without
	Sent   time.Time // just before the request was sent (before any dial)
	Got    time.Time // when the response was read; zero without one
	Reused bool      // it went on a connection an earlier request had opened
	Body   string    // the response body's first 200 bytes
	Err    error     // as counted in Failures; nil when it passed Check
}

// Result summarises a run, or the part of it done so far.
type Result struct {
	// Requests counts completed requests, failed ones included. Failures counts the
	// requests that got no response or whose response failed Check. ConnectErrors (also
	// in Failures) counts connections refused or reset before any response byte: at dial,
	// or a new connection reset (one still queued on a listener that closed).
	//
	// Refused (also in Failures) counts connections refused (ECONNREFUSED), every one
	// of them, unlike Errors. Retries (also in Failures) counts requests that Go's
	// transport silently sent again on a new connection after the reused one failed:
	// each is a failure a client without that retry would have seen (ErrRetried).
	Requests, Failures, ConnectErrors int64
	Refused, Retries                  int64
	Errors                            []string         // first 20 distinct failure messages
	Versions                          map[string]int64 // responses per "version=X" at the start of the body
	Duration                          time.Duration    // from start until the last client finished (or now)
	P50, P99, Max                     time.Duration    // latency of requests that got a response
	RPS                               float64          // Requests per second of Duration
}

func (r Result) String() string {
	return fmt.Sprintf("%d requests (%d failed, %d connect errors, %d refused, %d retried) in %v, %.0f rps, p50 %v p99 %v max %v, versions %v",
		r.Requests, r.Failures, r.ConnectErrors, r.Refused, r.Retries, r.Duration.Round(time.Millisecond), r.RPS,
		r.P50, r.P99, r.Max, r.Versions)
}

// Run generates load until ctx is done, MaxRequests were sent or MaxDuration passed,
// whichever comes first, and returns the result. The error is only about the Options:
// a run that ends by ctx returns its result and nil.
func Run(ctx context.Context, o Options) (Result, error) {
	l, err := Start(ctx, o)
	if err != nil {
		return Result{}, err
	}
	<-l.done
	return l.Snapshot(), nil
}

// Load is a run in the background. Its methods are safe to call concurrently.
type Load struct {
	start    time.Time
	rec      *recorder
	stop     chan struct{} // closed by Stop: clients send no new request
	stopOnce sync.Once
	done     chan struct{} // closed when every client has returned
	end      time.Time     // set before done is closed
}

// Start begins the run that Run describes and returns at once.
func Start(ctx context.Context, o Options) (*Load, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Load{
		start: time.Now(),
		rec:   newRecorder(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	bounds := &bounds{stop: l.stop, deadline: l.start.Add(o.MaxDuration), max: int64(o.MaxRequests)}
	var wg sync.WaitGroup
	for i := range o.Clients {
		c := newClient(o, l.rec, i)
		wg.Go(func() { c.run(ctx, bounds) })
	}
	go func() {
		wg.Wait()
		l.end = time.Now()
		close(l.done)
	}()
	return l, nil
}

// Stop makes the clients send no new request, waits for those in flight (each bounded by
// Timeout; cancel the context to abort them) and returns the final result. Calling it
// again returns the same result.
func (l *Load) Stop() Result {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	return l.Snapshot()
}

// Done is closed when the run has ended, by any bound or by Stop.
func (l *Load) Done() <-chan struct{} { return l.done }

// Snapshot returns the result so far, or the final one once the run has ended.
func (l *Load) Snapshot() Result {
	select {
	case <-l.done:
		return l.rec.result(l.end.Sub(l.start))
	default:
		return l.rec.result(time.Since(l.start))
	}
}

// bounds are shared by all clients of a run; each client checks them before each request.
type bounds struct {
	stop     <-chan struct{}
	deadline time.Time
	max      int64
	issued   atomic.Int64
}

// next reports whether another request may be sent, and takes its place in the count.
func (b *bounds) next(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-b.stop:
		return false
	default:
	}
	return time.Now().Before(b.deadline) && b.issued.Add(1) <= b.max
}

func (o Options) withDefaults() (Options, error) {
	if err := checkLoopbackURL(o.URL); err != nil {
		return o, err
	}
	switch {
	case o.Clients < 1:
		return o, fmt.Errorf("loadgen: Clients = %d, want >= 1", o.Clients)
	case o.MaxRequests <= 0:
		return o, fmt.Errorf("loadgen: MaxRequests = %d, want > 0", o.MaxRequests)
	case o.MaxDuration <= 0:
		return o, fmt.Errorf("loadgen: MaxDuration = %v, want > 0", o.MaxDuration)
	case o.Timeout < 0:
		return o, fmt.Errorf("loadgen: Timeout = %v, want >= 0", o.Timeout)
	}
	for _, src := range o.Sources {
		if !isLoopbackIP(src) {
			return o, fmt.Errorf("%w: source %q", ErrNotLoopback, src)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Check == nil {
		o.Check = CheckVersion
	}
	return o, nil
}

// CheckVersion is the default Check: status 200 and a body that starts with "version=".
func CheckVersion(status int, body []byte) error {
	if status != 200 {
		return fmt.Errorf("status %d: %q", status, clip(body))
	}
	if !bytes.HasPrefix(body, []byte("version=")) {
		return fmt.Errorf("body %q does not start with version=", clip(body))
	}
	return nil
}

func clip(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("loadgen: URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("loadgen: URL %q: want http or https", raw)
	}
	if h := u.Hostname(); h != "localhost" && !isLoopbackIP(h) {
		return fmt.Errorf("%w: %q", ErrNotLoopback, raw)
	}
	return nil
}

func isLoopbackIP(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
