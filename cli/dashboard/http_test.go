package dashboard

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// fakeSource answers a fixed status and one log line per stream.
type fakeSource struct{}

func (fakeSource) Status(context.Context) (*api.Status, error) {
	return st(api.App{Name: "web", State: "running", Workers: []api.Worker{{Slot: 0, PID: 42, State: "ready"}}}), nil
}

func (fakeSource) Logs(ctx context.Context, errStream bool, _ int, fn func(api.LogLine)) error {
	fn(api.LogLine{App: "web", Line: "hello"})
	<-ctx.Done()
	return nil
}

func startServer(t *testing.T, maxClients int) (base string) {
	t.Helper()
	srv, err := New(Options{Source: fakeSource{}, Token: "secret", Poll: 50 * time.Millisecond, MaxClients: maxClients})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Run(ctx, ln); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "http://" + ln.Addr().String()
}

func TestTokenRequired(t *testing.T) {
	base := startServer(t, 2)
	for path, want := range map[string]int{
		"/": 403, "/secre/": 403, "/secretx/": 403, "/x/events": 403, "/app.js": 403,
		"/secret/": 200, "/secret/app.js": 200, "/secret/nope": 404, "/secret": 200, // redirected
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp, err := http.Post(base+"/secret/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}
}

func TestEventsSnapshotThenUpdatesAndClientLimit(t *testing.T) {
	base := startServer(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/secret/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// A second page is one too many.
	resp2, err := http.Get(base + "/secret/events")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("second page: %d, want 503", resp2.StatusCode)
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !(seen["snapshot"] && seen["update"] && seen["hello"]) {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			seen[name] = true
		}
		if strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), `"line":"hello"`) {
			seen["hello"] = true
		}
	}
	if !seen["snapshot"] || !seen["update"] || !seen["hello"] {
		t.Errorf("events seen %v, want a snapshot, an update and the log line", seen)
	}
}

// countingSource records the log follows: started, and ended.
type countingSource struct {
	fakeSource
	started, ended chan bool
}

func (s countingSource) Logs(ctx context.Context, errStream bool, _ int, fn func(api.LogLine)) error {
	s.started <- errStream
	<-ctx.Done()
	s.ended <- errStream
	return nil
}

func TestLogsFollowedOnlyWhilePagesOpen(t *testing.T) {
	src := countingSource{started: make(chan bool, 8), ended: make(chan bool, 8)}
	srv, err := New(Options{Source: src, Token: "secret", Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx, ln) })
	defer func() { cancel(); wg.Wait() }()

	select {
	case <-src.started:
		t.Fatal("a log follow started with no page open")
	case <-time.After(300 * time.Millisecond):
	}
	pctx, closePage := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(pctx, http.MethodGet, "http://"+ln.Addr().String()+"/secret/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for range 2 { // stdout's and stderr's
		select {
		case <-src.started:
		case <-time.After(5 * time.Second):
			t.Fatal("no log follow after a page opened")
		}
	}
	closePage()
	for range 2 {
		select {
		case <-src.ended:
		case <-time.After(5 * time.Second):
			t.Fatal("the log follows went on after the last page left")
		}
	}
}
