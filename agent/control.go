package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
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
// follows, waits until every connection it accepted is answered and closed,
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

func newControlServer(h http.Handler, connContext func(context.Context, net.Conn) context.Context, log hclog.Logger) *controlServer {
	c := &controlServer{conns: newOpenConns(), served: make(chan struct{}), log: log}
	c.stopping, c.cancel = context.WithCancel(context.Background())
	c.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext:       connContext,
		ConnState:         c.conns.track,
		ErrorLog:          log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
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

// stop stops accepting, answers what was accepted (at most
// controlStopTimeout), then shuts the server down.
func (c *controlServer) stop(l net.Listener) {
	deadline := time.Now().Add(controlStopTimeout)
	c.cancel()
	c.srv.SetKeepAlivesEnabled(false) // also closes the idle connections
	// Our copy only: tableflip, or the next agent, holds its own.
	if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		c.log.Debug("close the control listener", "error", err)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	// Serve has returned once Accept failed: every connection it accepted
	// has been counted by then.
	select {
	case <-c.served:
	case <-t.C:
	}
	select {
	case <-c.conns.none():
	case <-t.C:
		c.log.Warn("control requests still running at shutdown; cutting them", "connections", c.conns.count())
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
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
