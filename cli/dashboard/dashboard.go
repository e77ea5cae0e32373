// Package dashboard serves deployd's live web dashboard for `deployd
// dashboard`: it polls the agent's status once a second (one poll for every
// browser), follows the apps' logs, derives a timeline of events from the
// changes between two statuses, and pushes all of it to the open pages over
// server-sent events. It is read-only and every asset is in the binary.
package dashboard

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
)

// Source is what the dashboard reads from the agent. The CLI gives it the
// control client, so the agent's privilege table applies to the user who
// runs the dashboard, unchanged.
type Source interface {
	// Status returns the agent's status of every app.
	Status(ctx context.Context) (*api.Status, error)
	// Logs follows every app's stdout (stderr if errStream) after its
	// last lines lines, calling fn for each, until ctx is done or the
	// stream ends.
	Logs(ctx context.Context, errStream bool, lines int, fn func(api.LogLine)) error
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	Source Source
	// Token is the secret every URL starts with (NewToken makes one).
	Token string
	Log   hclog.Logger
	// Poll is how often the agent's status is read (default 1s).
	Poll time.Duration
	// MaxClients bounds the pages open at once (default 16); one more
	// gets 503.
	MaxClients int
	// History is how many samples of CPU and RSS each worker keeps for
	// its plots (default 300: five minutes at one a second).
	History int
	// LogLines is how many lines of each app's log a page gets (default 200).
	LogLines int
}

// Bounds of what the dashboard keeps and sends.
const (
	maxEvents       = 500              // timeline entries kept
	clientBytes     = 1 << 20          // bytes a page may fall behind before it is dropped
	clientBuffer    = 64               // messages a page may fall behind before it is dropped
	writeTimeout    = 5 * time.Second  // one write to a page
	keepAlive       = 15 * time.Second // a comment line on an idle stream
	statusTimeout   = 3 * time.Second  // one status call
	logFlush        = 250 * time.Millisecond
	logRetry        = 2 * time.Second // after a log stream ended
	maxLinesPerTick = 200             // log lines per app per flush; the rest are counted as skipped
	maxBytesPerTick = 64 << 10        // and their bytes
	maxTailBytes    = 256 << 10       // bytes of an app's tail a new page gets (LogLines at most)
	maxLineBytes    = 4 << 10
)

// NewToken returns a random token of 128 bits for the dashboard's URL.
func NewToken() string { return rand.Text() }

// Server is a dashboard. Run serves it.
type Server struct {
	opts Options
	hub  *hub

	visited   chan struct{} // closed at the first request with the token
	visitOnce sync.Once
}

// New returns a dashboard server for opts.
func New(opts Options) (*Server, error) {
	if opts.Source == nil || opts.Token == "" {
		return nil, errors.New("dashboard: a source and a token are required")
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = 16
	}
	if opts.History <= 0 {
		opts.History = 300
	}
	if opts.LogLines <= 0 {
		opts.LogLines = 200
	}
	return &Server{opts: opts, hub: newHub(opts), visited: make(chan struct{})}, nil
}

// Visited is closed when the first request with the token came: a browser
// has the URL (the CLI then removes the page that redirected to it).
func (s *Server) Visited() <-chan struct{} { return s.visited }

// Run serves the dashboard on ln until ctx is done, then stops every
// goroutine it started and returns.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          s.opts.Log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.hub.run(ctx) })
	wg.Go(func() { s.poll(ctx) })
	for _, errStream := range []bool{false, true} {
		wg.Go(func() { s.followLogs(ctx, errStream) })
	}
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.Serve(ln) })
	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		cancel()
	}
	// The hub has closed every page's stream once ctx is done, so the
	// handlers return and Shutdown does not wait for them.
	<-s.hub.done
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// poll reads the agent's status every Poll and hands it to the hub.
func (s *Server) poll(ctx context.Context) {
	t := time.NewTicker(s.opts.Poll)
	defer t.Stop()
	for {
		cx, cancel := context.WithTimeout(ctx, statusTimeout)
		st, err := s.opts.Source.Status(cx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		select {
		case s.hub.statusc <- statusResult{st: st, err: err, at: time.Now()}:
		case <-ctx.Done():
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// followLogs follows one stream of every app's log into the hub while a
// page is open (from the last LogLines lines when the first page opened),
// again after logRetry when the stream ends (the agent stopped): lines
// written while no agent answered are not shown.
func (s *Server) followLogs(ctx context.Context, errStream bool) {
	stream := "out"
	if errStream {
		stream = "err"
	}
	var last context.Context
	for {
		pages, ok := s.hub.awaitPages(ctx)
		if !ok {
			return
		}
		lines := s.opts.LogLines
		if pages == last {
			lines = 0 // the same pages: go on from now
		}
		last = pages
		fctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(pages, cancel)
		err := s.opts.Source.Logs(fctx, errStream, lines, func(l api.LogLine) {
			if l.Error != "" || l.App == "" {
				return
			}
			line := l.Line
			if len(line) > maxLineBytes {
				line = line[:maxLineBytes] + "…"
			}
			select {
			case s.hub.logc <- LogEntry{T: time.Now().UnixMilli(), App: l.App, Stream: stream, Line: line}:
			case <-fctx.Done():
			}
		})
		stop()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if pages.Err() != nil {
			continue // the last page left: wait for the next
		}
		s.opts.Log.Debug("log stream ended", "stream", stream, "error", err)
		select {
		case <-time.After(logRetry):
		case <-ctx.Done():
			return
		}
	}
}
