package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// app is the state shared by the handlers. Safe for concurrent use.
type app struct {
	cfg  config
	pid  int
	slot string // DEPLOYD_WORKER, verbatim (empty when run bare)
	out  *lineWriter

	mu   sync.Mutex
	kept [][]byte // owned by mu: memory held by /alloc for the life of the process
	// serving is when the app began to serve (set before it does); sick,
	// owned by mu, makes /healthz hang (GET /sick sets it).
	serving time.Time
	sick    bool

	// nodeChannel is kept open and referenced: closing it (or letting the GC finalize it)
	// would tell a Node-style parent that the worker disconnected.
	nodeChannel *os.File
}

func newApp(cfg config) *app {
	return &app{
		cfg:  cfg,
		pid:  os.Getpid(),
		slot: os.Getenv("DEPLOYD_WORKER"),
		out:  &lineWriter{w: os.Stdout},
	}
}

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.handleIdentity)
	mux.HandleFunc("GET /slow", a.handleSlow)
	mux.HandleFunc("GET /alloc", a.handleAlloc)
	mux.HandleFunc("GET /log", a.handleLog)
	mux.HandleFunc("GET /healthz", a.handleHealth)
	mux.HandleFunc("GET /sick", a.handleSick)
	mux.HandleFunc("GET /notify", a.handleNotify)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Version", a.cfg.version)
		if !sleep(r, a.cfg.slow) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// handleHealth answers GET /healthz: 503 for -health-after after the app
// began to serve, then "ok"; no answer at all (until the client gives up)
// once GET /sick was served.
func (a *app) handleHealth(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	sick := a.sick
	a.mu.Unlock()
	if sick {
		<-r.Context().Done()
		return
	}
	if left := a.cfg.healthAfter - time.Since(a.serving); left > 0 {
		http.Error(w, fmt.Sprintf("not healthy yet: %s left (-health-after)", left.Round(time.Millisecond)), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok")
}

// handleSick makes this process's /healthz hang from now on, as a worker
// whose health check is stuck on a dead dependency; everything else still
// serves. It answers like GET /, so the caller learns which worker it was.
func (a *app) handleSick(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.sick = true
	a.mu.Unlock()
	warnf("GET /healthz hangs from now on (GET /sick)")
	a.handleIdentity(w, r)
}

// handleIdentity answers GET / with the body the load generator checks.
func (a *app) handleIdentity(w http.ResponseWriter, _ *http.Request) {
	fmt.Fprintf(w, "version=%s pid=%d slot=%s\n", a.cfg.version, a.pid, a.slot)
}

// handleSlow answers like GET / after ?ms=N milliseconds.
func (a *app) handleSlow(w http.ResponseWriter, r *http.Request) {
	ms, ok := intParam(w, r, "ms", 10*60*1000)
	if ok {
		warnf("slow request started ms=%d", ms) // tests wait for this line
	}
	if ok && sleep(r, time.Duration(ms)*time.Millisecond) {
		a.handleIdentity(w, r)
	}
}

// handleAlloc allocates ?mb=N MiB, touches every page so it is resident, and keeps it.
func (a *app) handleAlloc(w http.ResponseWriter, r *http.Request) {
	mb, ok := intParam(w, r, "mb", 64*1024)
	if !ok {
		return
	}
	b := make([]byte, mb<<20)
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	a.mu.Lock()
	a.kept = append(a.kept, b)
	total := 0
	for _, k := range a.kept {
		total += len(k) >> 20
	}
	a.mu.Unlock()
	fmt.Fprintf(w, "allocated=%dMiB held=%dMiB\n", mb, total)
}

// handleLog writes ?n=N lines "log <slot> <pid> <i>" to stdout.
func (a *app) handleLog(w http.ResponseWriter, r *http.Request) {
	n, ok := intParam(w, r, "n", 100_000_000)
	if ok {
		a.writeLines("log", n, r.Context().Done())
		fmt.Fprintf(w, "wrote %d lines\n", n)
	}
}

// handleNotify sends ?state=S (e.g. "STATUS=busy") on NOTIFY_SOCKET and
// answers with its identity, so a test knows which worker sent it.
func (a *app) handleNotify(w http.ResponseWriter, r *http.Request) {
	if !a.notify(r.URL.Query().Get("state")) {
		http.Error(w, "sd_notify: not sent", http.StatusInternalServerError)
		return
	}
	a.handleIdentity(w, r)
}

// intParam reads a query parameter in [0, limit]; on a bad value it answers 400.
func intParam(w http.ResponseWriter, r *http.Request, name string, limit int) (int, bool) {
	n, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil || n < 0 || n > limit {
		http.Error(w, fmt.Sprintf("want ?%s=N with 0 <= N <= %d", name, limit), http.StatusBadRequest)
		return 0, false
	}
	return n, true
}

// sleep waits d; it reports false if the client went away first.
func sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// writeLines writes n lines "<prefix> <slot> <pid> <i>", i from 1 to n, to stdout as fast
// as it can, in chunks of whole lines. It returns early once stop is closed.
func (a *app) writeLines(prefix string, n int, stop <-chan struct{}) {
	const chunk = 64 << 10
	buf := make([]byte, 0, chunk+256)
	head := fmt.Sprintf("%s %s %d ", prefix, a.slot, a.pid)
	for i := 1; i <= n; i++ {
		buf = append(buf, head...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, '\n')
		if len(buf) >= chunk || i == n {
			a.out.write(buf)
			buf = buf[:0]
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

// ticks writes "tick <slot> <pid> <n>" every d until stop: numbered lines a test finds
// in the log exactly once each.
func (a *app) ticks(d time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(d)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-stop:
			return
		case <-t.C:
			a.out.printf("tick %s %d %d\n", a.slot, a.pid, n)
		}
	}
}

// lineWriter serialises writes to stdout so that lines written by concurrent handlers and
// the log spammer never interleave mid-line. Safe for concurrent use.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) write(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(p)
}

func (l *lineWriter) printf(format string, args ...any) {
	l.write(fmt.Appendf(nil, format, args...))
}
