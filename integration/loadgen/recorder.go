package loadgen

import (
	"maps"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

const (
	maxErrors = 20
	// Latencies are recorded in microseconds, from 1 µs to an hour, to 3 significant
	// digits (log-linear buckets, ~200 KiB).
	histMaxMicros = int64(time.Hour / time.Microsecond)
)

// recorder accumulates the samples of all clients. Safe for concurrent use.
type recorder struct {
	mu                                sync.Mutex
	hist                              *hdrhistogram.Histogram
	max                               time.Duration
	requests, failures, connectErrors int64
	refused, retries                  int64
	errors                            []string
	seen                              map[string]bool
	versions                          map[string]int64
}

func newRecorder() *recorder {
	return &recorder{
		hist:     hdrhistogram.New(1, histMaxMicros, 3),
		seen:     map[string]bool{},
		versions: map[string]int64{},
	}
}

func (r *recorder) record(s sample) {
	if s.aborted {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if s.gotResponse {
		r.hist.RecordValue(min(s.latency.Microseconds(), histMaxMicros))
		r.max = max(r.max, s.latency)
	}
	if s.version != "" {
		r.versions[s.version]++
	}
	if s.retried {
		r.retries++
	}
	if s.err == nil {
		return
	}
	r.failures++
	if s.connect {
		r.connectErrors++
	}
	if s.refused {
		r.refused++
	}
	if msg := s.err.Error(); len(r.errors) < maxErrors && !r.seen[msg] {
		r.seen[msg] = true
		r.errors = append(r.errors, msg)
	}
}

// result returns a copy of the counts so far for a run that has lasted d.
func (r *recorder) result(d time.Duration) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{
		Requests:      r.requests,
		Failures:      r.failures,
		ConnectErrors: r.connectErrors,
		Refused:       r.refused,
		Retries:       r.retries,
		Errors:        append([]string(nil), r.errors...),
		Versions:      maps.Clone(r.versions),
		Duration:      d,
		Max:           r.max,
	}
	// The histogram answers with its bucket's upper end, which may pass the exact max.
	res.P50 = min(time.Duration(r.hist.ValueAtQuantile(50))*time.Microsecond, r.max)
	res.P99 = min(time.Duration(r.hist.ValueAtQuantile(99))*time.Microsecond, r.max)
	if d > 0 {
		res.RPS = float64(r.requests) / d.Seconds()
	}
	return res
}
