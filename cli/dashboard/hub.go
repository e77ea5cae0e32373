package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// Sample is one reading of a worker's CPU (percent of a core) and RSS (bytes).
type Sample struct {
	T   int64   `json:"t"` // Unix milliseconds
	CPU float64 `json:"c"`
	RSS int64   `json:"r"`
}

// LogEntry is one line of an app's log; Stream is "out" or "err".
type LogEntry struct {
	T      int64  `json:"t"`
	App    string `json:"app"`
	Stream string `json:"s"`
	Line   string `json:"line"`
}

// snapshot is the first message of every page: all the hub holds.
type snapshot struct {
	T       int64                 `json:"t"`
	PollMS  int64                 `json:"poll_ms"`
	Agent   api.Agent             `json:"agent"`
	Apps    []api.App             `json:"apps"`
	Error   string                `json:"error,omitempty"`
	Samples map[string][]Sample   `json:"samples"` // by pid
	Events  []Event               `json:"events"`
	Logs    map[string][]LogEntry `json:"logs"` // by app
}

// update is what changed at one poll: the apps whose state, workers or
// canary changed (whole), the order of every app, one sample per worker.
type update struct {
	T       int64             `json:"t"`
	Agent   api.Agent         `json:"agent"`
	Order   []string          `json:"order"`
	Apps    []api.App         `json:"apps,omitempty"`
	Error   string            `json:"error,omitempty"`
	Samples map[string]Sample `json:"samples,omitempty"`
}

type statusResult struct {
	st  *api.Status
	err error
	at  time.Time
}

// client is one open page; its channel is closed by the hub when the page
// falls clientBytes (or clientBuffer messages) behind or the dashboard
// stops.
type client struct {
	ch chan []byte
	// gone is closed with ch: the page's handler then ends a write it is
	// stuck in at once instead of at its deadline.
	gone chan struct{}
	// queued is the bytes sent on ch and not yet written to the page: the
	// hub adds a message's length before it sends it, the page's handler
	// takes it off once the message is written (or failed).
	queued atomic.Int64
}

// offer queues msg for the page without waiting; false if the page is too
// far behind: clientBytes already queued (a message is always taken by an
// empty queue, however long), or clientBuffer messages.
func (c *client) offer(msg []byte) bool {
	n := int64(len(msg))
	if q := c.queued.Add(n); q > n && q > clientBytes {
		c.queued.Add(-n)
		return false
	}
	select {
	case c.ch <- msg:
		return true
	default:
		c.queued.Add(-n)
		return false
	}
}

// sent takes a message the page's handler wrote (or failed to) off queued.
func (c *client) sent(msg []byte) { c.queued.Add(-int64(len(msg))) }

type joinReq struct {
	reply chan joinReply
}

type joinReply struct {
	c    *client
	snap []byte // nil: too many pages open
}

// hub owns everything the pages are shown: the last status, the samples,
// the timeline, the log tails and the open pages. Owned by run; others
// reach it through its channels.
type hub struct {
	opts    Options
	statusc chan statusResult
	logc    chan LogEntry
	joinc   chan joinReq
	leavec  chan *client
	awaitc  chan chan context.Context
	done    chan struct{} // closed when run returned

	// pages is done when the last page left; the log follows run under it
	// (awaitPages), so no page open, no log read from the agent.
	pages       context.Context
	pagesCancel context.CancelFunc
	waiting     []chan context.Context

	status  *api.Status
	err     string
	shapes  map[string][]byte // app -> its status without the readings
	samples map[int][]Sample
	events  []Event
	logs    map[string][]LogEntry
	pending map[string]*lineBatch // app -> its lines since the last flush
	clients map[*client]struct{}
}

func newHub(opts Options) *hub {
	return &hub{
		opts: opts, statusc: make(chan statusResult), logc: make(chan LogEntry, 256),
		joinc: make(chan joinReq), leavec: make(chan *client), awaitc: make(chan chan context.Context),
		done:   make(chan struct{}),
		shapes: map[string][]byte{}, samples: map[int][]Sample{}, logs: map[string][]LogEntry{},
		pending: map[string]*lineBatch{},
		clients: map[*client]struct{}{},
	}
}

func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	defer func() {
		for c := range h.clients {
			h.drop(c)
		}
		h.pagesChanged()
	}()
	flush := time.NewTicker(logFlush)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-h.statusc:
			h.onStatus(r)
		case l := <-h.logc:
			h.addLine(l)
		case <-flush.C:
			h.flushLogs()
		case j := <-h.joinc:
			j.reply <- h.join()
		case c := <-h.leavec:
			if _, ok := h.clients[c]; ok {
				h.drop(c)
			}
			h.pagesChanged()
		case r := <-h.awaitc:
			if h.pages != nil {
				r <- h.pages
			} else {
				h.waiting = append(h.waiting, r)
			}
		}
	}
}

// pagesChanged starts the pages' context when the first page joined, and
// ends it when the last one left (or the hub stops).
func (h *hub) pagesChanged() {
	switch {
	case len(h.clients) > 0 && h.pages == nil:
		h.pages, h.pagesCancel = context.WithCancel(context.Background())
		// The follows start again from the last lines: the tail held
		// from an earlier page would hold them twice.
		clear(h.logs)
		for _, r := range h.waiting {
			r <- h.pages // buffered
		}
		h.waiting = nil
	case len(h.clients) == 0 && h.pages != nil:
		h.pagesCancel()
		h.pages, h.pagesCancel = nil, nil
	}
}

// awaitPages waits until a page is open and returns a context that ends
// when the last page leaves; false when ctx ended or the hub stopped.
func (h *hub) awaitPages(ctx context.Context) (context.Context, bool) {
	r := make(chan context.Context, 1)
	select {
	case h.awaitc <- r:
	case <-ctx.Done():
		return nil, false
	case <-h.done:
		return nil, false
	}
	select {
	case p := <-r:
		return p, true
	case <-ctx.Done():
		return nil, false
	case <-h.done:
		return nil, false
	}
}

// join registers a page and returns the snapshot it starts from.
func (h *hub) join() joinReply {
	if len(h.clients) >= h.opts.MaxClients {
		return joinReply{}
	}
	c := &client{ch: make(chan []byte, clientBuffer), gone: make(chan struct{})}
	h.clients[c] = struct{}{}
	h.pagesChanged() // before the snapshot: the first page's clears the log tails
	snap := snapshot{T: time.Now().UnixMilli(), PollMS: h.opts.Poll.Milliseconds(), Error: h.err,
		Samples: map[string][]Sample{}, Events: h.events, Logs: h.logs}
	if h.status != nil {
		snap.Agent, snap.Apps = h.status.Agent, h.status.Apps
	}
	for pid, s := range h.samples {
		snap.Samples[strconv.Itoa(pid)] = s
	}
	b := frame("snapshot", snap)
	c.queued.Store(int64(len(b))) // it waits for the page like a message
	return joinReply{c: c, snap: b}
}

// onStatus takes one poll's answer: the timeline gets what changed, the
// samples a reading, the pages an update.
func (h *hub) onStatus(r statusResult) {
	now := r.at.UnixMilli()
	if r.err != nil {
		msg := r.err.Error()
		if h.err == "" {
			h.addEvents([]Event{{T: now, Kind: "agent", Slot: -1, Text: "agent unreachable: " + msg}})
		}
		h.err = msg
		u := update{T: now, Error: msg}
		if h.status != nil {
			u.Agent = h.status.Agent
			u.Order = appNames(h.status)
		}
		h.broadcast(frame("update", u))
		return
	}
	if h.err != "" {
		h.addEvents([]Event{{T: now, Kind: "agent", Slot: -1, Text: "agent answers again"}})
		h.err = ""
	}
	h.addEvents(diffStatus(h.status, r.st, now))
	u := update{T: now, Agent: r.st.Agent, Order: appNames(r.st), Samples: map[string]Sample{}}
	live := map[int]bool{}
	shapes := map[string][]byte{}
	for _, a := range r.st.Apps {
		shapes[a.Name] = shape(a)
		if !bytes.Equal(shapes[a.Name], h.shapes[a.Name]) {
			u.Apps = append(u.Apps, a)
		}
		for _, w := range a.Workers {
			if w.PID == 0 {
				continue
			}
			live[w.PID] = true
			s := Sample{T: now, CPU: w.CPUPercent, RSS: w.RSSBytes}
			u.Samples[strconv.Itoa(w.PID)] = s
			h.samples[w.PID] = appendBounded(h.samples[w.PID], s, h.opts.History)
		}
	}
	for pid := range h.samples {
		if !live[pid] {
			delete(h.samples, pid)
		}
	}
	for name := range h.logs {
		if _, ok := shapes[name]; !ok {
			delete(h.logs, name)
		}
	}
	h.shapes, h.status = shapes, r.st
	h.broadcast(frame("update", u))
}

// shape is a's status without what changes at every poll (CPU, RSS,
// uptime, time to recycle): an app is sent again only when its shape changed.
func shape(a api.App) []byte {
	ws := make([]api.Worker, len(a.Workers))
	for i, w := range a.Workers {
		w.CPUPercent, w.RSSBytes, w.UptimeSeconds = 0, 0, 0
		if w.RecycleInSeconds != nil { // counts down like the uptime: the page does it
			zero := 0.0
			w.RecycleInSeconds = &zero
		}
		ws[i] = w
	}
	a.Workers = ws
	if a.Canary != nil {
		c := *a.Canary
		c.HeldSeconds = 0
		a.Canary = &c
	}
	b, _ := json.Marshal(a)
	return b
}

func appNames(st *api.Status) []string {
	names := make([]string, 0, len(st.Apps))
	for _, a := range st.Apps {
		names = append(names, a.Name)
	}
	return names
}

func (h *hub) addEvents(evs []Event) {
	if len(evs) == 0 {
		return
	}
	for _, e := range evs {
		h.events = appendBounded(h.events, e, maxEvents)
	}
	h.broadcast(frame("events", evs))
}

// broadcast queues msg for every page without waiting; a page that fell
// clientBytes behind is dropped (its browser reconnects and starts again
// from a snapshot), so the pages hold at most clientBytes of messages
// each, however many stop reading.
func (h *hub) broadcast(msg []byte) {
	for c := range h.clients {
		if !c.offer(msg) {
			h.drop(c)
		}
	}
	h.pagesChanged()
}

// drop forgets page c and closes its channel; what it still had queued is
// let go at once, and its handler ends the write it may be stuck in.
func (h *hub) drop(c *client) {
	delete(h.clients, c)
	close(c.ch)
	close(c.gone)
	for msg := range c.ch {
		c.sent(msg)
	}
}

// appendBounded appends v to s and keeps the last n elements; it copies
// when it drops, so a slice handed out earlier (a snapshot) is not changed.
func appendBounded[T any](s []T, v T, n int) []T {
	if len(s) < n {
		return append(s, v)
	}
	out := make([]T, n, n+n/4)
	copy(out, s[len(s)-n+1:])
	out[n-1] = v
	return out
}

// frame is one server-sent event.
func frame(name string, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`null`)
	}
	return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, b)
}
