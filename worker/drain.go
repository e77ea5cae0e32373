// This file is the drain (moved here from internal/graceful, which the demo
// and test apps used).
//
// Why not http.Server.Shutdown alone: a connection the server has accepted
// but whose request it has not read yet is closed without an answer when the
// request arrives after Shutdown began (net/http checks shuttingDown() right
// after reading a request). With a listener shared by several workers, the
// kernel hands such connections to a draining worker all the time, so a
// reload would drop a few requests. Shutdown and SetKeepAlivesEnabled(false)
// also close idle keep-alive connections at once, racing a client that is
// sending its next request on one (a client that does not retry loses it).
//
// Drain instead stops accepting, answers every request with
// "Connection: close", and closes a keep-alive connection only once it has
// been idle for IdleGrace, so a client in the middle of reusing it gets its
// answer (and the close) instead of a reset.

package worker

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// IdleGrace is how long a keep-alive connection must have been idle before
// Drain closes it.
const IdleGrace = time.Second

// Server is an http.Server that tracks its connections, so that Drain
// loses no request. Make one with NewServer.
type Server struct {
	HTTP *http.Server

	draining atomic.Bool

	mu        sync.Mutex
	conns     map[net.Conn]connState
	listeners []net.Listener
	wg        sync.WaitGroup
}

type connState struct {
	state http.ConnState
	since time.Time
}

// NewServer wraps srv; it sets srv.ConnState (chaining any hook already there) and
// wraps srv.Handler to add "Connection: close" while draining.
func NewServer(srv *http.Server) *Server {
	s := &Server{HTTP: srv, conns: map[net.Conn]connState{}}
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		s.mu.Lock()
		if st == http.StateClosed || st == http.StateHijacked {
			delete(s.conns, c)
		} else {
			s.conns[c] = connState{st, time.Now()}
		}
		s.mu.Unlock()
		if prev != nil {
			prev(c, st)
		}
	}
	h := srv.Handler
	if h == nil {
		h = http.DefaultServeMux
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &closeOnDrain{ResponseWriter: w, s: s}
		h.ServeHTTP(cw, r)
		if !cw.wrote && s.draining.Load() {
			w.Header().Set("Connection", "close") // net/http writes the header after us
		}
	})
	return s
}

// closeOnDrain adds "Connection: close" to an answer whose header is written
// while the server drains, so a request in flight when the drain began also
// ends its connection.
type closeOnDrain struct {
	http.ResponseWriter
	s     *Server
	wrote bool
}

func (w *closeOnDrain) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if w.s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closeOnDrain) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *closeOnDrain) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush keeps streaming answers (SSE) working through the wrapper.
func (w *closeOnDrain) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack keeps websocket upgrades working through the wrapper.
func (w *closeOnDrain) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
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

// Drain stops accepting, lets every accepted connection finish its requests
// (answered with Connection: close), closes keep-alive connections idle for
// IdleGrace, and returns when none is left or ctx ends (then it closes the
// rest).
func (s *Server) Drain(ctx context.Context) error {
	s.draining.Store(true)
	s.mu.Lock()
	ls := s.listeners
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	s.wg.Wait() // no Accept runs any more
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if s.closeIdle(time.Now()) == 0 {
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

// closeIdle closes connections idle for IdleGrace and returns how many are
// left.
func (s *Server) closeIdle(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := 0
	for c, st := range s.conns {
		idle := st.state == http.StateIdle && now.Sub(st.since) >= IdleGrace
		// A connection that never sent a request (Go's own rule: 5 s).
		silent := st.state == http.StateNew && now.Sub(st.since) >= 5*time.Second
		if idle || silent {
			c.Close()
			delete(s.conns, c)
			continue
		}
		left++
	}
	return left
}
