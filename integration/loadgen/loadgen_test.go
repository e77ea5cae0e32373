package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is an httptest server that counts requests and new connections.
type server struct {
	*httptest.Server
	requests, conns atomic.Int64
}

func newServer(t *testing.T, h func(n int64, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(s.requests.Add(1), w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func ok(n int64, w http.ResponseWriter, _ *http.Request) {
	fmt.Fprintf(w, "version=v1 n=%d\n", n)
}

func TestRunChecksEveryResponse(t *testing.T) {
	s := newServer(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		switch {
		case n%10 == 0:
			http.Error(w, "boom", http.StatusInternalServerError)
		case n%2 == 0:
			fmt.Fprintf(w, "version=v2 n=%d\n", n)
		default:
			fmt.Fprintf(w, "version=v1 n=%d\n", n)
		}
	})
	res, err := Run(context.Background(), Options{
		URL: s.URL + "/", Clients: 4, KeepAlive: true, MaxRequests: 200, MaxDuration: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Requests != 200 || s.requests.Load() != 200 {
		t.Errorf("Requests = %d, server saw %d, want 200", res.Requests, s.requests.Load())
	}
	if res.Failures != 20 || res.ConnectErrors != 0 {
		t.Errorf("Failures = %d, ConnectErrors = %d, want 20, 0", res.Failures, res.ConnectErrors)
	}
	if res.Versions["v1"] != 100 || res.Versions["v2"] != 80 || len(res.Versions) != 2 {
		t.Errorf("Versions = %v, want v1:100 v2:80", res.Versions)
	}
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0], "status 500") {
		t.Errorf("Errors = %q, want one distinct status 500", res.Errors)
	}
	if res.P50 <= 0 || res.P50 > res.P99 || res.P99 > res.Max || res.RPS <= 0 {
		t.Errorf("latencies p50 %v p99 %v max %v, rps %v", res.P50, res.P99, res.Max, res.RPS)
	}
}

func TestErrorsAreDistinctAndCapped(t *testing.T) {
	s := newServer(t, func(n int64, w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "nope %d", n)
	})
	res, err := Run(context.Background(), Options{URL: s.URL, Clients: 2, KeepAlive: true, MaxRequests: 50, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failures != 50 || len(res.Errors) != maxErrors {
		t.Errorf("Failures = %d, len(Errors) = %d, want 50, %d", res.Failures, len(res.Errors), maxErrors)
	}
}

func TestKeepAliveConnections(t *testing.T) {
	for _, keepAlive := range []bool{true, false} {
		// The first 5 requests wait for each other, so every client gets to send one.
		all := make(chan struct{})
		s := newServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
			if n == 5 {
				close(all)
			}
			if n <= 5 {
				<-all
			}
			ok(n, w, r)
		})
		res, err := Run(context.Background(), Options{
			URL: s.URL, Clients: 5, KeepAlive: keepAlive, MaxRequests: 100, MaxDuration: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		want := int64(5)
		if !keepAlive {
			want = 100
		}
		if res.Failures != 0 || s.conns.Load() != want {
			t.Errorf("KeepAlive %v: %d failures, %d connections, want 0, %d (%q)",
				keepAlive, res.Failures, s.conns.Load(), want, res.Errors)
		}
	}
}

func TestMaxDurationBound(t *testing.T) {
	s := newServer(t, ok)
	res, err := Run(context.Background(), Options{
		URL: s.URL, Clients: 3, KeepAlive: true, MaxRequests: 1 << 30, MaxDuration: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Duration < 200*time.Millisecond || res.Duration > 5*time.Second || res.Requests == 0 {
		t.Errorf("run of 200ms took %v with %d requests", res.Duration, res.Requests)
	}
	if res.Requests != s.requests.Load() || res.Failures != 0 {
		t.Errorf("Requests = %d (%d failed), server saw %d", res.Requests, res.Failures, s.requests.Load())
	}
}

func TestContextCancelEndsRunWithoutFailures(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 50 {
			cancel()
		}
		ok(n, w, r)
	})
	res, err := Run(ctx, Options{URL: s.URL, Clients: 4, KeepAlive: true, MaxRequests: 1 << 30, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 40 || res.Requests > 60 || res.Failures != 0 {
		t.Errorf("cancel at the 50th request: %d requests, %d failures (%q)", res.Requests, res.Failures, res.Errors)
	}
}

func TestStartStopSnapshot(t *testing.T) {
	first := make(chan struct{})
	s := newServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 10 {
			close(first)
		}
		ok(n, w, r)
	})
	l, err := Start(context.Background(), Options{URL: s.URL, Clients: 2, KeepAlive: true, MaxRequests: 1 << 30, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	<-first
	if snap := l.Snapshot(); snap.Requests > 1<<30 || snap.Duration <= 0 {
		t.Errorf("Snapshot = %v", snap)
	}
	res := l.Stop()
	if res.Requests < 10 || res.Requests != s.requests.Load() || res.Failures != 0 {
		t.Errorf("Stop = %v, server saw %d", res, s.requests.Load())
	}
	if again := l.Stop(); again.Requests != res.Requests || again.Duration != res.Duration {
		t.Errorf("second Stop = %v, first %v", again, res)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Done not closed after Stop")
	}
}

func TestTimeoutIsAFailure(t *testing.T) {
	s := newServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	})
	res, err := Run(context.Background(), Options{URL: s.URL, Clients: 1, MaxRequests: 2, MaxDuration: time.Minute, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 2 || res.Failures != 2 || res.ConnectErrors != 0 {
		t.Errorf("Run = %v, want 2 failures, no connect errors", res)
	}
}

func TestCustomCheck(t *testing.T) {
	s := newServer(t, ok)
	res, err := Run(context.Background(), Options{
		URL: s.URL, Clients: 1, MaxRequests: 3, MaxDuration: time.Minute,
		Check: func(int, []byte) error { return errors.New("never good enough") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failures != 3 || res.Versions["v1"] != 3 {
		t.Errorf("Run = %v, want 3 failures and versions still counted", res)
	}
}

func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	res, err := Run(context.Background(), Options{URL: "http://" + addr + "/", Clients: 2, MaxRequests: 10, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 10 || res.Failures != 10 || res.ConnectErrors != 10 {
		t.Errorf("Run = %v, want 10 connect errors", res)
	}
}

// TestQueuedConnectionReset closes a listener that never accepted: a connection still in
// its queue is reset, which counts as a connect error like a refused one does.
func TestQueuedConnectionReset(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	load, err := Start(context.Background(), Options{URL: "http://" + l.Addr().String() + "/", Clients: 1, MaxRequests: 1, MaxDuration: time.Minute})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // connected (queued) or not yet: either is a connect error
	l.Close()
	res := load.Stop()
	if res.Requests != 1 || res.ConnectErrors != 1 {
		t.Errorf("Run = %v (%q), want 1 connect error", res, res.Errors)
	}
}

func TestRefusesNonLoopback(t *testing.T) {
	for _, u := range []string{
		"http://192.0.2.1/", "http://10.0.0.1:8080/", "http://example.com/", "http://[2001:db8::1]/",
		"http://localhost.example.com/", "http://0.0.0.0:80/",
	} {
		o := Options{URL: u, Clients: 1, MaxRequests: 1, MaxDuration: time.Second}
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("Run(%s) = %v, want ErrNotLoopback", u, err)
		}
		if _, err := Start(context.Background(), o); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("Start(%s) = %v, want ErrNotLoopback", u, err)
		}
	}
	if err := dialLoopbackOnly("tcp", "192.0.2.1:80", nil); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("dialer allowed 192.0.2.1: %v", err)
	}
}

func TestLocalhostAndOptionErrors(t *testing.T) {
	s := newServer(t, ok)
	_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	res, err := Run(context.Background(), Options{URL: "http://localhost:" + port + "/", Clients: 1, MaxRequests: 2, MaxDuration: time.Minute})
	if err != nil || res.Failures != 0 || res.Requests != 2 {
		t.Errorf("localhost: %v %v", res, err)
	}
	good := Options{URL: s.URL, Clients: 1, MaxRequests: 1, MaxDuration: time.Second}
	for name, mod := range map[string]func(*Options){
		"Clients":     func(o *Options) { o.Clients = 0 },
		"MaxRequests": func(o *Options) { o.MaxRequests = 0 },
		"MaxDuration": func(o *Options) { o.MaxDuration = 0 },
		"scheme":      func(o *Options) { o.URL = "ftp://127.0.0.1/" },
	} {
		o := good
		mod(&o)
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestVersionOf(t *testing.T) {
	for body, want := range map[string]string{
		"version=v1 pid=1 slot=0\n": "v1", "version=v2\n": "v2", "version=v3": "v3", "ok": "", "": "",
	} {
		if got := versionOf([]byte(body)); got != want {
			t.Errorf("versionOf(%q) = %q, want %q", body, got, want)
		}
	}
}

// TestRetryOnReusedConnIsAFailure: the server closes every connection, without an
// answer, when the second request arrives on it. Go's transport then silently sends
// the GET again on a new connection, which answers: every request after the first
// would pass if loadgen did not count the retry.
func TestRetryOnReusedConnIsAFailure(t *testing.T) {
	type perConn struct{ n atomic.Int64 }
	type key struct{}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(key{}).(*perConn).n.Add(1) >= 2 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		fmt.Fprintln(w, "version=v1")
	}))
	s.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, key{}, &perConn{})
	}
	s.Start()
	t.Cleanup(s.Close)
	res, err := Run(context.Background(), Options{
		URL: s.URL + "/", Clients: 1, KeepAlive: true, MaxRequests: 10, MaxDuration: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Requests != 10 || res.Retries != 9 || res.Failures != 9 {
		t.Errorf("Requests %d, Retries %d, Failures %d: want 10, 9, 9 (each retry on a new connection is a failure)",
			res.Requests, res.Retries, res.Failures)
	}
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0], ErrRetried.Error()) {
		t.Errorf("Errors = %q, want the retry", res.Errors)
	}
}

// TestRefusedCountsEveryRefusal: Errors keeps 20 distinct messages; Refused counts all.
func TestRefusedCountsEveryRefusal(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens: every connect is refused
	res, err := Run(context.Background(), Options{
		URL: "http://" + addr + "/", Clients: 2, KeepAlive: false, MaxRequests: 50, MaxDuration: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 50 || res.Refused != 50 || res.ConnectErrors != 50 || res.Failures != 50 {
		t.Errorf("got %s, want 50 requests all refused", res)
	}
}

// TestSourcesAndObserve: each client connects from its Sources address,
// and Observe sees every counted request with its times, connection reuse
// and body; a source that is not loopback is refused.
func TestSourcesAndObserve(t *testing.T) {
	var fromSecond atomic.Int64
	s := newServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.RemoteAddr, "127.0.0.3:") {
			fromSecond.Add(1)
		}
		ok(n, w, r)
	})
	var mu sync.Mutex
	var seen []Observation
	res, err := Run(context.Background(), Options{URL: s.URL + "/", Clients: 2, KeepAlive: true, MaxRequests: 40,
		MaxDuration: time.Minute, Sources: []string{"127.0.0.2", "127.0.0.3"}, Observe: func(o Observation) {
			mu.Lock()
			seen = append(seen, o)
			mu.Unlock()
		}})
	if err != nil || res.Failures != 0 {
		t.Fatalf("%v, %v", res, err)
	}
	reused := 0
	for _, o := range seen {
		if o.Source != []string{"127.0.0.2", "127.0.0.3"}[o.Client] || o.Got.Before(o.Sent) || !strings.HasPrefix(o.Body, "version=v1") || o.Err != nil {
			t.Fatalf("observation %+v", o)
		}
		if o.Reused {
			reused++
		}
	}
	if len(seen) != 40 || reused != 38 || fromSecond.Load() == 0 || fromSecond.Load() == 40 {
		t.Errorf("%d observations (%d reused), %d requests from 127.0.0.3; want 40 (38), some", len(seen), reused, fromSecond.Load())
	}
	if _, err := Run(context.Background(), Options{URL: s.URL + "/", Clients: 1, MaxRequests: 1, MaxDuration: time.Second,
		Sources: []string{"192.0.2.1"}}); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("a source off loopback: %v, want ErrNotLoopback", err)
	}
}
