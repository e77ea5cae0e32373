package dashboard

import (
	"crypto/subtle"
	"embed"
	"net/http"
	"strings"
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
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: 2000\n\n")) || !write(j.snap) {
		return
	}
	ping := time.NewTicker(keepAlive)
	defer ping.Stop()
	for {
		select {
		case msg, ok := <-j.c.ch:
			if !ok || !write(msg) {
				return
			}
		case <-ping.C:
			if !write([]byte(": ping\n\n")) {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}
