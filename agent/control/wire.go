package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// The wire encoding of the control API: JSON answers and errors, and
// streamed answers (application/x-ndjson) of progress events and results,
// or of log lines.

// logStreamFlush is how often a following logs answer is flushed to the client.
const logStreamFlush = 50 * time.Millisecond

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeErr answers err with the status of its kind (agent.KindOf).
func writeErr(w http.ResponseWriter, err error) {
	k := agent.KindOf(err)
	writeJSON(w, k.HTTPStatus(), api.Error{Error: err.Error(), Kind: k, Reason: agent.ReasonOf(err)})
}

// writeError answers msg with status code.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, api.Error{Error: msg, Kind: api.KindOfStatus(code)})
}

// answer returns the answer of a call that is one JSON value: the core's
// result, or its error.
func answer(w http.ResponseWriter) func(v any, err error) {
	return func(v any, err error) {
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// decode reads a JSON body into v; it answers 400 itself on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true // an empty body is an empty request
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request too large: the limit is %d bytes", mbe.Limit))
		return false
	}
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("data after the JSON value")
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad request: the body is not valid JSON for this call: "+err.Error())
		return false
	}
	return true
}

// apiEvent is the wire form of a workers event.
func apiEvent(e workers.Event) api.Event {
	return api.Event{Time: e.Time, App: e.App, Type: api.EventType(e.Type), Slot: e.Slot, PID: e.PID,
		Release: e.Release, Millis: e.Millis, Message: e.Message}
}

// stream writes StreamLines to an HTTP answer, which it starts (200,
// ndjson) at its first line: until then the operation may still be
// refused with an error answer (refuse). Safe for concurrent use.
type stream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	op      *opWriter // logs the operation; nil outside a control request
	started bool
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w), op: opOf(w)}
}

// start starts the answer; s.mu is held.
func (s *stream) start() {
	if s.started {
		return
	}
	s.started = true
	s.w.Header().Set("Content-Type", "application/x-ndjson")
	s.w.WriteHeader(http.StatusOK)
	if s.op != nil {
		s.op.streamStarted()
	}
}

func (s *stream) send(l api.StreamLine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.start()
	if s.op != nil {
		s.op.logLine(l)
	}
	// A client that went away does not stop the operation.
	_ = json.NewEncoder(s.w).Encode(l)
	_ = s.rc.Flush()
}

func (s *stream) event(e workers.Event) {
	ae := apiEvent(e)
	s.send(api.StreamLine{Event: &ae})
}

// refuse answers err, the refusal of an operation before it began: the
// core refuses before its first event, so the answer has not started.
func (s *stream) refuse(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeErr(s.w, err)
}

// logStream writes api.LogLines to an HTTP answer, which it starts at its
// first line or flush, flushing it every logStreamFlush rather than after
// each line. Each write has a deadline (deadlineWriter): at the first that
// fails (the client stopped reading, or went away) it calls gone, which
// ends the call, and Send says agent.ErrClientGone from then on. Safe for
// concurrent use; close stops its flusher goroutine and waits for it.
type logStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	gone    context.CancelFunc
	started bool
	dirty   bool
	err     error // the first write error: the client went away

	stop chan struct{}
	done chan struct{}
}

func newLogStream(w http.ResponseWriter, gone context.CancelFunc) *logStream {
	s := &logStream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w), gone: gone,
		stop: make(chan struct{}), done: make(chan struct{})}
	go s.flusher()
	return s
}

// start starts the answer; s.mu is held.
func (s *logStream) start() {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.WriteHeader(http.StatusOK)
	}
}

// failed records err, the result of a write; s.mu is held.
func (s *logStream) failed(err error) {
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("%w: %w", agent.ErrClientGone, err)
		s.gone()
	}
}

// Send writes l.
func (s *logStream) Send(l api.LogLine) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.start()
	if s.err == nil {
		s.failed(s.enc.Encode(l))
		s.dirty = true
	}
	return s.err
}

// failure is the first write error (nil: none).
func (s *logStream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Flush passes on what was written (and starts the answer).
func (s *logStream) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.start()
	if s.dirty && s.err == nil {
		s.failed(s.rc.Flush())
		s.dirty = false
	}
}

// flush is the flusher's: it does not start the answer.
func (s *logStream) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started && s.dirty && s.err == nil {
		s.failed(s.rc.Flush())
		s.dirty = false
	}
}

func (s *logStream) flusher() {
	defer close(s.done)
	t := time.NewTicker(logStreamFlush)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.flush()
		}
	}
}

func (s *logStream) close() {
	close(s.stop)
	<-s.done
}

func queryInt(s string, def int) (int, error) {
	if s == "" {
		return def, nil
	}
	return strconv.Atoi(s)
}

func queryBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean (use 1 or 0)", s)
	}
	return b, nil
}
