package dashboard

import (
	"crypto/subtle"
	"embed"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

//go:embed assets
var assets embed.FS

// page are the files of the page, by their name after the token.
var page = map[string]string{
	"":          "assets/index.html",
	"app.js":    "assets/app.js",
	"style.css": "assets/style.css",
}

var contentTypes = map[string]string{
	"":          "text/html; charset=utf-8",
	"app.js":    "text/javascript; charset=utf-8",
	"style.css": "text/css; charset=utf-8",
}

// Handler serves the dashboard: every path starts with /TOKEN/; any other
// gets 403. Only GET and HEAD.
func (s *Server) Handler() http.Handler {
	token := []byte(s.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		tok, rest, hasSlash := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if subtle.ConstantTimeCompare([]byte(tok), token) != 1 {
			http.Error(w, "forbidden: open the URL that `deployd dashboard` printed (it holds the token)", http.StatusForbidden)
			return
		}
		s.visitOnce.Do(func() { close(s.visited) })
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the dashboard is read-only", http.StatusMethodNotAllowed)
			return
		}
		if !hasSlash {
			// Relative URLs of the page (app.js, events) need the slash.
			http.Redirect(w, r, "/"+tok+"/", http.StatusFound)
			return
		}
		if rest == "events" {
			s.serveEvents(w, r)
			return
		}
		file, ok := page[rest]
		if !ok {
			http.NotFound(w, r)
			return
		}
		b, err := assets.ReadFile(file)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", contentTypes[rest])
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "+
			"connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		w.Write(b)
	})
}

// serveEvents streams the hub's messages to one page: a snapshot, then
// updates, until the page goes, falls behind or the dashboard stops.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	reply := make(chan joinReply, 1)
	select {
	case s.hub.joinc <- joinReq{reply: reply}:
	case <-s.hub.done:
		http.Error(w, "the dashboard is stopping", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		return
	}
	j := <-reply
	if j.c == nil {
		http.Error(w, "too many dashboard pages open; close one", http.StatusServiceUnavailable)
		return
	}
	defer func() {
		select {
		case s.hub.leavec <- j.c:
		case <-s.hub.done:
		}
	}()
	defer endWritesWhenGone(r, j.c.gone)()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	p := &pageStream{w: w, rc: http.NewResponseController(w), gone: j.c.gone}
	if !p.write([]byte("retry: 2000\n\n")) || !p.write(j.snap) {
		return
	}
	j.c.sent(j.snap)
	ping := time.NewTicker(keepAlive)
	defer ping.Stop()
	for {
		select {
		case msg, ok := <-j.c.ch:
			if !ok {
				return
			}
			written := p.write(msg)
			j.c.sent(msg)
			if !written {
				return
			}
		case <-ping.C:
			if !p.write([]byte(": ping\n\n")) {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// endWritesWhenGone ends a write to r's connection, at once, once gone is
// closed (the hub dropped the page): a write stuck on a page that stopped
// reading then lets go of its message instead of holding it until
// writeTimeout. Call the func it returns when the handler ends.
func endWritesWhenGone(r *http.Request, gone <-chan struct{}) func() {
	conn, ok := r.Context().Value(connKey{}).(net.Conn)
	if !ok {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-gone:
			_ = conn.SetWriteDeadline(time.Now()) // a net.Conn's methods are safe to call concurrently
		case <-done:
		}
	})
	return func() { close(done); wg.Wait() }
}

// connKey is the context key of a request's connection (Run puts it).
type connKey struct{}

// pageStream writes one page's event stream, each write within
// writeTimeout.
type pageStream struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	gone <-chan struct{} // the hub dropped the page
}

func (p *pageStream) write(b []byte) bool {
	_ = p.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	select {
	case <-p.gone: // after the deadline was set: a drop from now on ends the write
		return false
	default:
	}
	if _, err := p.w.Write(b); err != nil {
		return false
	}
	return p.rc.Flush() == nil
}
