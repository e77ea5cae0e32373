package control

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
)

// controlStopTimeout bounds how long a stopping agent keeps answering the
// control requests it had accepted.
const controlStopTimeout = 5 * time.Second

// controlServer is the control socket's HTTP server and its stop.
//
// It does not stop through http.Server.Shutdown alone: net/http closes,
// unanswered, a connection whose request it reads after Shutdown began
// (conn.serve returns when the server is shutting down right after
// readRequest). During a handoff the old agent had often accepted a
// connection whose request was still on its way: the client got EOF,
// although the new agent was serving. So stop first stops accepting, turns
// keep-alives off (each connection closes after its answer), ends the log
// follows, answers every request still to come with "stopping, ask again"
// (gate), waits until every connection it accepted is answered and closed,
// and only then calls Shutdown, which has nothing left to cut.
type controlServer struct {
	srv   *http.Server
	conns *openConns
	// stopping is cancelled when stop begins: handlers that stream for as
	// long as the client wants (logs -f) end on it.
	stopping context.Context
	cancel   context.CancelFunc
	served   chan struct{} // closed when serve returns
	log      hclog.Logger
}

// newControlServer serves h; lim, when set, is the listener serve is given:
// it learns from the server when each connection it counted closes.
func newControlServer(h http.Handler, connContext func(context.Context, net.Conn) context.Context, lim *connLimiter, log hclog.Logger) *controlServer {
	c := &controlServer{conns: newOpenConns(), served: make(chan struct{}), log: log}
	c.stopping, c.cancel = context.WithCancel(context.Background())
	track := c.conns.track
	if lim != nil {
		track = func(conn net.Conn, s http.ConnState) {
			c.conns.track(conn, s)
			lim.track(conn, s)
		}
	}
	c.srv = &http.Server{
		Handler:           withWriteDeadline(c.gate(h)),
		ReadHeaderTimeout: 10 * time.Second,
		// Without it an idle keep-alive connection stays open for ever
		// (net/http falls back to ReadTimeout, which is 0 here: a handler
		// streams for as long as its client wants).
		IdleTimeout: controlIdleTimeout,
		ConnContext: connContext,
		ConnState:   track,
		ErrorLog:    log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	return c
}

// serve serves l until stop; it returns nil when stop ended it.
func (c *controlServer) serve(l net.Listener) error {
	defer close(c.served)
	err := c.srv.Serve(l)
	if c.stopping.Err() != nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// gate answers every request that arrives once the stop has begun with
// 503 and api.StoppingHeader, without running it: after a handoff this
// agent must not act any more (a reload here would stop workers the new
// agent has adopted), and the client asks again, of the new agent. A
// request that got in before goes on to its answer.
func (c *controlServer) gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.stopping.Err() == nil {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set(api.StoppingHeader, "1")
		writeJSON(w, http.StatusServiceUnavailable, api.Error{Kind: api.KindStopping,
			Error: "the agent is stopping (shutting down, or handing over to a new agent) and did nothing; ask again"})
	})
}

// stop stops accepting, answers what was accepted (at most
// controlStopTimeout), then shuts the server down.
func (c *controlServer) stop(l net.Listener) {
	ctx, cancel := context.WithTimeout(context.Background(), controlStopTimeout)
	defer cancel()
	c.cancel()
	c.srv.SetKeepAlivesEnabled(false) // also closes the idle connections
	// Our copy only: tableflip, or the next agent, holds its own.
	if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		c.log.Debug("close the control listener", "error", err)
	}
	// Serve has returned once Accept failed: every connection it accepted
	// has been counted by then.
	select {
	case <-c.served:
	case <-ctx.Done():
	}
	select {
	case <-c.conns.none():
	case <-ctx.Done():
		if n := c.conns.count(); n > 0 {
			c.log.Warn("control requests still running at shutdown; cutting them", "connections", n)
		}
	}
	_ = c.srv.Shutdown(ctx)
}

// openConns counts a server's open connections (http.Server.ConnState).
type openConns struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

func newOpenConns() *openConns {
	c := &openConns{zero: make(chan struct{})}
	close(c.zero)
	return c
}

func (c *openConns) track(_ net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s {
	case http.StateNew:
		if c.n == 0 {
			c.zero = make(chan struct{})
		}
		c.n++
	case http.StateClosed, http.StateHijacked:
		c.n--
		if c.n == 0 {
			close(c.zero)
		}
	}
}

// none is closed once no connection is open (at once if none is now).
func (c *openConns) none() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.zero
}

func (c *openConns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
