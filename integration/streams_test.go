package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// streamApp is the Express tutorial app with a Server-Sent-Events route
// that never ends by itself: the first event names the worker's pid, then
// a tick every 250 ms.
const streamApp = `const express = require('express')
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

app.get('/events', (req, res) => {
  res.set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' })
  res.flushHeaders()
  res.write('data: pid=' + process.pid + '\n\n')
  const t = setInterval(() => res.write('data: tick\n\n'), 250)
  req.on('close', () => clearInterval(t))
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

// sseClients keeps n event streams open on a URL: a client whose stream
// ends connects again, until stop. Every client is bounded by the context
// of start.
type sseClients struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	opened  atomic.Int64 // streams that got their first event
	ended   atomic.Int64 // streams that ended (cleanly or not) before stop
	mu      sync.Mutex
	holders map[int]int // worker pid -> streams it holds now
}

func startSSE(t *testing.T, url string, n int, d time.Duration) *sseClients {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	c := &sseClients{cancel: cancel, holders: map[int]int{}}
	tr := &http.Transport{MaxConnsPerHost: 0, DisableCompression: true}
	hc := &http.Client{Transport: tr}
	for range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for ctx.Err() == nil {
				c.stream(ctx, hc, url)
				select { // pace reconnects after an error
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	t.Cleanup(func() { c.stop(); tr.CloseIdleConnections() })
	return c
}

// stream reads one event stream until it ends.
func (c *sseClients) stream(ctx context.Context, hc *http.Client, url string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := hc.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	pid := 0
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "data: pid="); ok && pid == 0 {
			pid, _ = strconv.Atoi(v)
			c.opened.Add(1)
			c.mu.Lock()
			c.holders[pid]++
			c.mu.Unlock()
		}
	}
	if pid != 0 {
		c.mu.Lock()
		c.holders[pid]--
		c.mu.Unlock()
		if ctx.Err() == nil {
			c.ended.Add(1)
		}
	}
}

// holding returns the pids that hold streams now.
func (c *sseClients) holding() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]int{}
	for pid, k := range c.holders {
		if k > 0 {
			out[pid] = k
		}
	}
	return out
}

func (c *sseClients) stop() {
	c.cancel()
	c.wg.Wait()
}

// A rolling reload of 4 Node.js workers while 20 SSE clients hold streams
// takes about as long as one without them: each old worker drains in the
// background (status shows it draining) while the roll moves on, and is
// gone by its stop_timeout. Meanwhile a keep-alive and a new-connection
// load see no failed request.
func TestNodeReloadDoesNotWaitForStreams(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	const instances, streams = 4, 20
	const stopTimeout = 10 * time.Second
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": streamApp})
	cfg := strings.Replace(nodeConfig(dir, []string{"node", "app.js"}, port, instances, ""),
		`stop_timeout = "15s"`, fmt.Sprintf("stop_timeout = %q", stopTimeout.String()), 1)
	a := StartAgent(t, bins, cfg)
	a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	stopLoad := helloLoad(t, port, 10, 3*time.Minute)

	// reload returns how long the reload took, the status right after it,
	// and its steps (--json: events with their times).
	reload := func(what string) (time.Duration, *api.Status, rollSteps) {
		t.Helper()
		t0 := time.Now()
		r := a.CLI("reload", "--json", "--timeout", "2m", "web")
		took := time.Since(t0)
		st := a.Status()
		if r.Code != 0 {
			t.Fatalf("reload %s: exit %d\n%s\n%s\n%s", what, r.Code, r.Stdout, r.Stderr, a.Log())
		}
		if !AllReady(st, "web", instances) {
			t.Fatalf("after the reload %s: %+v", what, appOf(st, "web"))
		}
		return took, st, parseRoll(t, r.Stdout, t0.Add(took))
	}
	drained := func(what string) {
		t.Helper()
		a.WaitFor("the old workers to drain "+what, stopTimeout+15*time.Second,
			func(st *api.Status) bool { return len(appOf(st, "web").Draining) == 0 })
	}

	quick, _, quickSteps := reload("without streams")
	drained("without streams")

	sse := startSSE(t, fmt.Sprintf("http://127.0.0.1:%d/events", port), streams, 2*time.Minute)
	a.WaitFor("every stream open", 30*time.Second, func(*api.Status) bool { return sse.opened.Load() >= streams })
	holders := sse.holding()
	slow, st, slowSteps := reload("with streams")
	draining := map[int]bool{}
	for _, w := range appOf(st, "web").Draining {
		draining[w.PID] = true
	}
	t.Logf("reload of %d workers: %s without streams (%s), %s with %d SSE clients on %d of them (%s); stop_timeout %s; "+
		"draining when it returned: %v", instances, quick.Round(time.Millisecond), quickSteps,
		slow.Round(time.Millisecond), streams, len(holders), slowSteps, stopTimeout, draining)
	// The machine's load moves the startups by seconds; what a reload
	// does besides them (signals, swaps and, before, the drains) does not.
	for k, gap := range slowSteps.afterDrain {
		if gap > stopTimeout/4 {
			t.Errorf("the roll went on %s after old worker %d was told to drain: it waited for its streams", gap, k)
		}
	}
	if slowSteps.besides > quickSteps.besides+stopTimeout/2 {
		t.Errorf("the reload spent %s besides its workers' startups with streams open, %s without: it waited for the drains",
			slowSteps.besides, quickSteps.besides)
	}
	t0 := time.Now()
	drained("with streams")
	t.Logf("the last old worker was gone %s after the reload returned", time.Since(t0).Round(100*time.Millisecond))
	for pid := range holders {
		if Alive(pid) {
			t.Errorf("old worker %d still runs after its drain", pid)
		}
	}

	ka, nka := stopLoad()
	sse.stop()
	t.Logf("streams: %d opened, %d ended by the server", sse.opened.Load(), sse.ended.Load())
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
}

// rollSteps is what a reload's events tell of it: how long after each old
// worker's draining event the roll went on (to the next step, or to its
// end), and how long it took besides its new workers' startups.
type rollSteps struct {
	afterDrain []time.Duration
	startups   time.Duration // the sum of ready-after-start of the new workers
	besides    time.Duration // the reload's time less startups
}

func (r rollSteps) String() string {
	var gaps []string
	for _, g := range r.afterDrain {
		gaps = append(gaps, g.Round(time.Millisecond).String())
	}
	return fmt.Sprintf("startups %s, besides %s, on after each drain began: %s", r.startups.Round(time.Millisecond),
		r.besides.Round(time.Millisecond), strings.Join(gaps, " "))
}

// parseRoll reads the events of `deployd reload --json` (the result is the
// last line) of a reload that ended at end.
func parseRoll(t *testing.T, out string, end time.Time) rollSteps {
	t.Helper()
	var events []api.Event
	var start time.Time
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e api.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Type == "" {
			continue // the result
		}
		if start.IsZero() {
			start = e.Time
		}
		events = append(events, e)
	}
	var r rollSteps
	for i, e := range events {
		switch e.Type {
		case api.EventReady:
			r.startups += time.Duration(e.Millis) * time.Millisecond
		case api.EventDraining:
			next := end
			for _, f := range events[i+1:] {
				if f.Type != api.EventExited && f.Type != api.EventDraining {
					next = f.Time
					break
				}
			}
			r.afterDrain = append(r.afterDrain, next.Sub(e.Time))
		}
	}
	if len(events) == 0 {
		t.Fatalf("no events in the reload's output:\n%s", out)
	}
	r.besides = end.Sub(start) - r.startups
	return r
}
