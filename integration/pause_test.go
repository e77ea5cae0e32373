package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// deployd pause holds an app's new connections in the kernel; deployd
// resume has every one of them answered, none refused; status says how
// many wait. A shared app is refused with the fix, and --max resumes by
// itself.
func TestPauseHoldsConnectionsUntilResume(t *testing.T) {
	needSteering(t)
	parallel(t) // see parallel.go
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 2, "v1", "", `balance = "even"`))
	a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })

	if r := a.CLIWithin(time.Minute, "pause", "web"); r.Code != 0 {
		t.Fatalf("pause: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	// Clients that connect while paused: each on a new connection.
	const n = 20
	type answer struct {
		body string
		err  error
		at   time.Time
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
			var b strings.Builder
			if err == nil {
				_, err = fmt.Fprint(&b, resp.Status)
				resp.Body.Close()
			}
			answers <- answer{b.String(), err, time.Now()}
		}()
	}
	// Every one of them waits in the kernel: status counts them.
	a.WaitFor("20 connections queued", 30*time.Second, func(st *api.Status) bool {
		p := appOf(st, "web").Paused
		return p != nil && p.Queued == n
	})
	if r := a.CLIWithin(time.Minute, "status"); !strings.Contains(r.Stdout, "web: PAUSED for") ||
		!strings.Contains(r.Stdout, fmt.Sprintf("%d new connections wait", n)) {
		t.Errorf("status does not show the pause:\n%s", r.Stdout)
	}
	select {
	case ans := <-answers:
		t.Fatalf("a connection was answered while paused: %+v", ans)
	default:
	}
	resumed := time.Now()
	if r := a.CLIWithin(time.Minute, "resume", "web"); r.Code != 0 {
		t.Fatalf("resume: exit %d\n%s", r.Code, r.Stderr)
	}
	wg.Wait()
	close(answers)
	got := 0
	for ans := range answers {
		if ans.err != nil || ans.body != "200 OK" {
			t.Errorf("a connection made while paused: %q, %v", ans.body, ans.err)
			continue
		}
		if ans.at.Before(resumed) {
			t.Errorf("answered at %s, before the resume at %s", ans.at, resumed)
		}
		got++
	}
	if got != n {
		t.Errorf("%d of %d connections answered after the resume", got, n)
	}
	if p := a.App("web").Paused; p != nil {
		t.Errorf("status after resume: still paused %+v", p)
	}

	// --max ends a pause by itself.
	if r := a.CLIWithin(time.Minute, "pause", "web", "--max", "1s"); r.Code != 0 {
		t.Fatalf("pause --max 1s: exit %d\n%s", r.Code, r.Stderr)
	}
	a.WaitFor("the pause's maximum", 30*time.Second, func(st *api.Status) bool { return appOf(st, "web").Paused == nil })
	if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "v1") {
		t.Errorf("after --max: GET / = %q, %v", body, err)
	}
	if r := a.CLIWithin(time.Minute, "pause", "web", "--max", "-1s"); r.Code != 2 {
		t.Errorf("pause --max -1s: exit %d, want 2\n%s", r.Code, r.Stderr)
	}
}

// A shared app cannot be paused: the refusal names the fix and changes
// nothing.
func TestPauseRefusesASharedApp(t *testing.T) {
	parallel(t) // see parallel.go
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 1, "v1", "", ""))
	a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	r := a.CLIWithin(time.Minute, "pause", "web")
	if r.Code != 2 || !strings.Contains(r.Stderr, `set balance = "even" in [apps.web]`) {
		t.Errorf("pause of a shared app: exit %d, want 2 naming the fix\n%s", r.Code, r.Stderr)
	}
	if p := a.App("web").Paused; p != nil {
		t.Errorf("a refused pause paused: %+v", p)
	}
	if body, err := get(t, port, "/"); err != nil || !strings.Contains(body, "v1") {
		t.Errorf("after the refused pause: GET / = %q, %v", body, err)
	}
}
