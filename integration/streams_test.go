package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// streamApp is the Express tutorial app with a Server-Sent-Events route
// that never ends by itself (the first event names the worker's pid, then
// a tick every 250 ms) and a WebSocket server (the ws library) whose first
// message names the worker's pid.
const streamApp = `const express = require('express')
const { WebSocketServer } = require('ws')
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

const server = app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
const wss = new WebSocketServer({ server })
wss.on('connection', (ws) => ws.send('pid=' + process.pid))
`

// A rolling reload of 4 Node.js workers while 20 SSE and 20 WebSocket
// clients hold streams takes about as long as one without them: each old
// worker drains in the background (status shows it draining, with its
// open connections) while the roll moves on. Every stream ends cleanly
// (the event stream's response ends; the WebSocket gets a close frame
// 1001) and its client reconnects, to another worker and in the end to a
// new one. Meanwhile a keep-alive and a new-connection load see no failed
// request.
func TestNodeReloadDoesNotWaitForStreams(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	const instances, sseClients, wsClients = 4, 20, 20
	const stopTimeout = 10 * time.Second
	// streamGrace is how long after its stop signal the Node.js preload
	// ends a worker's streams (a tenth of stop_timeout, 1 s at most): a
	// roll that waited for an old worker holding streams would wait this
	// long at least.
	const streamGrace = time.Second
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": streamApp})
	linkNodeModule(t, dir, "ws")
	// Node's startups take 10 s and more on a loaded 2-core machine; the
	// test is not about them.
	cfg := strings.NewReplacer(`stop_timeout = "15s"`, fmt.Sprintf("stop_timeout = %q", stopTimeout.String()),
		`ready_timeout = "20s"`, `ready_timeout = "90s"`).Replace(nodeConfig(dir, []string{"node", "app.js"}, port, instances, ""))
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

	streams := startStreams(t, port, sseClients, wsClients, 2*time.Minute)
	a.WaitFor("every stream open", 30*time.Second, func(*api.Status) bool {
		cur := streams.current()
		return len(cur) == sseClients+wsClients && !slices.Contains(slices.Collect(maps.Values(cur)), 0)
	})
	old := map[int]int{} // worker pid -> streams it holds
	for _, pid := range streams.current() {
		old[pid]++
	}
	slow, st, slowSteps := reload("with streams")
	var draining []string
	for _, w := range appOf(st, "web").Draining {
		if w.Connections == nil {
			t.Errorf("status right after the reload: draining worker %d has no connection count", w.PID)
			continue
		}
		draining = append(draining, fmt.Sprintf("%d: %d connections", w.PID, *w.Connections))
	}
	t.Logf("reload of %d workers: %s without streams (%s), %s with %d SSE and %d WebSocket clients on %d of them (%s); "+
		"stop_timeout %s; draining when it returned: %v", instances, quick.Round(time.Millisecond), quickSteps,
		slow.Round(time.Millisecond), sseClients, wsClients, len(old), slowSteps, stopTimeout, draining)
	// The machine's load moves the startups by seconds; what a reload
	// does besides them (signals, swaps and, before, the drains) does not.
	// A roll that waited for the drains would go on a grace or more after
	// each one began, and spend instances graces more besides the startups.
	slowGaps := 0
	for _, gap := range slowSteps.afterDrain {
		if gap >= streamGrace {
			slowGaps++
		}
	}
	if slowGaps > len(slowSteps.afterDrain)/2 {
		t.Errorf("the roll went on %d of %d times %s or more after an old worker was told to drain: it waited for its streams",
			slowGaps, len(slowSteps.afterDrain), streamGrace)
	}
	if slowSteps.besides > quickSteps.besides+instances*streamGrace/2 {
		t.Errorf("the reload spent %s besides its workers' startups with streams open, %s without: it waited for the drains",
			slowSteps.besides, quickSteps.besides)
	}
	t0 := time.Now()
	drained("with streams")
	t.Logf("the last old worker was gone %s after the reload returned", time.Since(t0).Round(100*time.Millisecond))
	for pid := range old {
		if Alive(pid) {
			t.Errorf("old worker %d still runs after its drain", pid)
		}
	}
	fresh := map[int]bool{}
	for _, w := range appOf(a.Status(), "web").Workers {
		fresh[w.PID] = true
	}
	a.WaitFor("every client on a new worker", 30*time.Second, func(*api.Status) bool {
		for _, pid := range streams.current() {
			if !fresh[pid] {
				return false
			}
		}
		return true
	})
	ka, nka := stopLoad()
	streams.stop()
	requireCleanReconnects(t, streams.all(), old)
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
}

// requireCleanReconnects checks every client's streams: each one a
// server ended, ended cleanly, and its client's next stream came from
// another worker; each client held a stream of an old worker (old) and
// reconnected at least once.
func requireCleanReconnects(t *testing.T, clients map[string][]streamSession, old map[int]int) {
	t.Helper()
	ends := map[string]int{}
	for name, ss := range clients {
		if len(ss) < 2 || old[ss[0].pid] == 0 {
			t.Errorf("%s: streams %+v: want one of an old worker, then at least one more", name, ss)
		}
		for i, s := range ss[:len(ss)-1] {
			ends[s.ended]++
			switch {
			case s.pid == 0 || !s.clean:
				t.Errorf("%s: stream %d (worker %d) did not end cleanly: %s", name, i, s.pid, s.ended)
			case ss[i+1].pid == s.pid:
				t.Errorf("%s: stream %d reconnected to worker %d, whose stream had just ended", name, i, s.pid)
			}
		}
	}
	t.Logf("%d clients; streams the server ended: %v", len(clients), ends)
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
