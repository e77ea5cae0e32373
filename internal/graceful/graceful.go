// Package graceful serves HTTP on inherited listeners and drains without
// dropping a request, for the demo app and the test app.
//
// Why not http.Server.Shutdown alone: a connection the server has accepted
// but whose request it has not read yet is closed without an answer when the
// request arrives after Shutdown began (net/http checks shuttingDown() right
// after reading a request). With a listener shared by several workers, the
// kernel hands such connections to a draining worker all the time, so a
// reload would drop a few requests. Drain instead stops accepting, answers
// every request already on its way with "Connection: close", and only then
// closes what is left.
package graceful

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server is an http.Server that counts its connections.
type Server struct {
	HTTP *http.Server

	mu        sync.Mutex
	conns     map[net.Conn]http.ConnState
	listeners []net.Listener
	wg        sync.WaitGroup
}

// New wraps srv; it sets srv.ConnState (chaining any hook already there).
func New(srv *http.Server) *Server {
	s := &Server{HTTP: srv, conns: map[net.Conn]http.ConnState{}}
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		s.mu.Lock()
		if st == http.StateClosed || st == http.StateHijacked {
			delete(s.conns, c)
		} else {
			s.conns[c] = st
		}
		s.mu.Unlock()
		if prev != nil {
			prev(c, st)
		}
	}
	return s
}

// Serve serves every listener in the background.
func (s *Server) Serve(ls []net.Listener) {
	s.mu.Lock()
	s.listeners = append(s.listeners, ls...)
	s.mu.Unlock()
	for _, l := range ls {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = s.HTTP.Serve(l)
		}()
	}
}

// Drain stops accepting, lets every accepted connection finish its request
// (answered with Connection: close), closes idle keep-alive connections, and
// returns when none is left or ctx ends (then it closes the rest).
func (s *Server) Drain(ctx context.Context) error {
	s.mu.Lock()
	ls := s.listeners
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	s.wg.Wait() // no Accept runs any more
	// Closes idle connections now; later answers carry Connection: close.
	s.HTTP.SetKeepAlivesEnabled(false)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if s.closeIdle() == 0 {
			return s.HTTP.Close()
		}
		select {
		case <-ctx.Done():
			s.HTTP.Close()
			return errors.Join(ctx.Err(), errors.New("connections still open when the drain timed out"))
		case <-t.C:
		}
	}
}

// closeIdle closes idle connections and returns how many are still busy.
// A connection idle after a response had Connection: close, or is a keep-
// alive connection a client may reuse at any moment: clients retry a request
// on such a connection (it is the race every keep-alive server has).
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := 0
	for c, st := range s.conns {
		if st == http.StateIdle {
			c.Close()
			delete(s.conns, c)
			continue
		}
		busy++
	}
	return busy
}
