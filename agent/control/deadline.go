package control

import (
	"net/http"
	"time"
)

// controlWriteTimeout bounds each write of an answer to a control client:
// a client that takes none of an answer's bytes for that long is dropped
// (its connection closed), so that it holds its goroutine, its connection
// slot and what the answer had ready no longer. A log answer is built as
// the client takes it, so that is one block of the file and one line.
const controlWriteTimeout = 30 * time.Second

// deadlineExtendEvery is how stale the deadline may get before a write
// moves it (a deadline is a timer: it is not moved at every line).
const deadlineExtendEvery = time.Second

// withWriteDeadline gives every write of every answer of h a deadline of
// controlWriteTimeout (deadlineWriter). It wraps the whole handler, so
// that a keep-alive connection's next answer, the stopping gate's
// included, never meets the deadline of the previous one.
func withWriteDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
		dw.extend()
		h.ServeHTTP(dw, r)
		dw.extend() // for what net/http writes once the handler returned
	})
}

// deadlineWriter is an answer's ResponseWriter whose writes and flushes
// each time out controlWriteTimeout after they begin (give or take
// deadlineExtendEvery). Used by one request at a time, as net/http
// allows.
type deadlineWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	last time.Time // when the deadline was last moved
}

// extend moves the deadline to controlWriteTimeout from now.
func (d *deadlineWriter) extend() {
	d.last = time.Now()
	_ = d.rc.SetWriteDeadline(d.last.Add(controlWriteTimeout))
}

// soon moves the deadline unless it was moved just before.
func (d *deadlineWriter) soon() {
	if time.Since(d.last) >= deadlineExtendEvery {
		d.extend()
	}
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.soon()
	return d.ResponseWriter.Write(b)
}

// FlushError is what http.ResponseController.Flush calls.
func (d *deadlineWriter) FlushError() error {
	d.soon()
	return d.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
