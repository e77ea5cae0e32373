package control

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
)

// opWriter is the ResponseWriter of one control request. It records how
// the request was answered so that the agent log says how every operation
// ended (reload, deploy, rollback, restart, scale, stop, start, ...): a
// refusal (4xx/5xx answer) is logged by routes when the handler returns,
// a streamed operation by its stream, with each app's outcome and duration,
// and every progress event (per-slot steps) at debug level.
type opWriter struct {
	http.ResponseWriter
	log   hclog.Logger
	kv    []any // op, call and caller
	start time.Time

	mu       sync.Mutex
	status   int
	errBody  []byte
	streamed bool
}

func newOpWriter(w http.ResponseWriter, r *http.Request, log hclog.Logger, caller []any) *opWriter {
	op := strings.TrimPrefix(r.URL.Path, "/v1/")
	kv := append([]any{"op", op}, caller...)
	return &opWriter{ResponseWriter: w, log: log, kv: kv, start: time.Now()}
}

func (w *opWriter) WriteHeader(code int) {
	w.mu.Lock()
	if w.status == 0 {
		w.status = code
	}
	w.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
}

func (w *opWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status >= 400 && len(w.errBody) < api.MaxRequestBytes {
		w.errBody = append(w.errBody, b...)
	}
	w.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (w *opWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish logs a request that was refused or failed without a stream.
// Called by routes after the handler returned.
func (w *opWriter) finish() {
	w.mu.Lock()
	status, body, streamed := w.status, w.errBody, w.streamed
	w.mu.Unlock()
	if streamed || status < 400 {
		return
	}
	var e api.Error
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	w.log.Warn("operation refused", append(w.fields(), "status", status, "error", msg)...)
}

func (w *opWriter) fields() []any {
	return append(append([]any{}, w.kv...), "duration", roundDur(time.Since(w.start)))
}

// streamStarted marks the request as a streamed operation.
func (w *opWriter) streamStarted() {
	w.mu.Lock()
	w.streamed = true
	w.mu.Unlock()
	// prepared_us: since the request arrived (the config re-read and checks).
	w.log.Debug("operation started", append(append([]any{}, w.kv...), "prepared_us", time.Since(w.start).Microseconds())...)
}

// step logs one progress event of the operation at debug level.
func (w *opWriter) step(e *api.Event) {
	kv := append(append([]any{}, w.kv...), "app", e.App, "event", e.Type, "worker", e.Slot)
	if e.PID != 0 {
		kv = append(kv, "pid", e.PID)
	}
	if e.Release != "" {
		kv = append(kv, "release", e.Release)
	}
	if e.Message != "" {
		kv = append(kv, "message", e.Message)
	}
	if e.Millis != 0 {
		kv = append(kv, "ms", e.Millis)
	}
	w.log.Debug("operation step", kv...)
}

// result logs how the operation ended for each app: info when it did what
// was asked (succeeded), warn otherwise (abandoned, failed, refused because
// busy...).
func (w *opWriter) result(l api.StreamLine) {
	if l.Result != nil {
		for _, r := range l.Result.Apps {
			w.ended(succeeded(r.Outcome), "app", r.App, "outcome", r.Outcome, "release", r.Release,
				"duration", secs(r.DurationSeconds), "error", r.Error, "exit_status", r.ExitStatus)
		}
	}
	if d := l.Deploy; d != nil {
		w.ended(d.Error == "", "app", d.App, "outcome", d.Status, "version", d.Version, "previous", d.Previous,
			"duration", secs(d.DurationSeconds), "error", d.Error, "exit_status", d.ExitStatus)
	}
}

// succeeded reports whether an app's outcome is what its operation asked
// for: done, a canary held, a canary promoted or aborted (a promote or an
// abort that ended a hold).
func succeeded(outcome string) bool {
	switch outcome {
	case api.OutcomeDone, api.OutcomeHeld, api.OutcomePromoted, api.OutcomeAborted:
		return true
	}
	return false
}

func (w *opWriter) ended(ok bool, kv ...any) {
	out := append([]any{}, w.kv...)
	for i := 0; i+1 < len(kv); i += 2 {
		if s, isStr := kv[i+1].(string); isStr && s == "" {
			continue // leave out empty fields
		}
		out = append(out, kv[i], kv[i+1])
	}
	if ok {
		w.log.Info("operation done", out...)
	} else {
		w.log.Warn("operation not done", out...)
	}
}

func secs(s float64) time.Duration { return roundDur(time.Duration(s * float64(time.Second))) }

// roundDur rounds a duration for the log: milliseconds below 10 s, else tenths.
func roundDur(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// opOf returns the request's opWriter under w, or nil.
func opOf(w http.ResponseWriter) *opWriter {
	for w != nil {
		if ow, ok := w.(*opWriter); ok {
			return ow
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// logLine sends one stream line to the operation's log.
func (w *opWriter) logLine(l api.StreamLine) {
	if l.Event != nil {
		w.step(l.Event)
	}
	w.result(l)
}
