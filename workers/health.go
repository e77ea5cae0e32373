package workers

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// readyProbeInterval is how often a starting worker with ready = "http:..."
// is probed until its health path answers 2xx (or ready_timeout passes).
const readyProbeInterval = 100 * time.Millisecond

// readyProbeTimeout bounds one readiness probe.
const readyProbeTimeout = 2 * time.Second

// maxHealthBody is how much of a probe's response body is read (and kept
// in the last error) before the connection closes.
const maxHealthBody = 256

// wantsHealthSocket tells whether spec's workers get a private health
// listener: with ready = "http:..." or a liveness check.
func (spec *Spec) wantsHealthSocket() bool {
	return spec.Ready.Mode == ReadyHTTP || spec.Health != nil
}

// healthState is a worker's health-check record, guarded by Worker.mu.
type healthState struct {
	// addr is the worker's health socket ("" when it has none); set
	// before the worker's goroutines start, read-only after.
	addr string
	// fails is the current run of failed liveness checks, total all of them.
	fails, total int
	// last is the last failure ("" when the last check passed).
	last string
}

// probe sends GET path to the health socket at addr and returns nil for a
// 2xx answer within timeout. Each probe is a new connection (closed after
// it), so a probe never holds one of the worker's connections open.
func probe(ctx context.Context, addr, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://deployd-health"+path, nil)
	if err != nil {
		return fmt.Errorf("health request %s: %w", path, err)
	}
	req.Header.Set("User-Agent", "deployd-health")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("GET %s: no answer within %s", path, timeout)
		}
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxHealthBody))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s %q", path, resp.Status, body)
	}
	return nil
}

// healthError is the last failed health check ("" when none or it passed).
func (w *Worker) healthError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health.last
}

// healthFailures returns the current run of failed liveness checks and
// the total.
func (w *Worker) healthFailures() (run, total int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health.fails, w.health.total
}

// checkHealth starts the worker's health checks on its socket at addr
// (none when addr is ""): the readiness probe for ready = "http:PATH" and
// the liveness check of spec.Health. The returned func ends them and waits
// for them; the worker's waiter calls it once the process is reaped. A
// failed liveness check adds 1 to failed (the app's count; may be nil).
func (w *Worker) checkHealth(spec *Spec, addr string, failed *atomic.Uint64) (stop func()) {
	w.health.addr = addr
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	if addr != "" && spec.Ready.Mode == ReadyHTTP && !w.isReady() {
		done.Go(func() { w.probeReady(ctx, spec.Ready.Path) })
	}
	if addr != "" && spec.Health != nil {
		done.Go(func() { w.watchHealth(ctx, *spec.Health, failed) })
	}
	return func() {
		cancel()
		done.Wait()
	}
}

// probeReady probes the worker's health path every readyProbeInterval and
// marks it ready at the first 2xx. Ends when ready or when ctx ends (the
// process was reaped); a worker that never passes is stopped by its
// operation at ready_timeout.
func (w *Worker) probeReady(ctx context.Context, path string) {
	t := time.NewTicker(readyProbeInterval)
	defer t.Stop()
	for {
		err := probe(ctx, w.health.addr, path, readyProbeTimeout)
		if err == nil {
			w.mu.Lock()
			w.health.last = ""
			w.mu.Unlock()
			w.markReady()
			return
		}
		w.mu.Lock()
		w.health.last = err.Error()
		w.mu.Unlock()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// watchHealth runs the liveness check h on the worker from when it is
// ready until ctx ends (the process was reaped); only a Ready worker is
// probed (not one draining or stopping). It only counts: the supervisor's
// tick replaces a worker whose run of failures reached h.Failures
// (monitor.go).
func (w *Worker) watchHealth(ctx context.Context, h HealthPolicy, failed *atomic.Uint64) {
	select {
	case <-w.ready:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(h.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if w.State() != Ready {
			continue
		}
		err := probe(ctx, w.health.addr, h.Path, h.Timeout)
		if ctx.Err() != nil {
			return // reaped meanwhile: not the app's failure
		}
		w.mu.Lock()
		if err == nil {
			w.health.fails, w.health.last = 0, ""
		} else {
			if failed != nil {
				failed.Add(1) // under mu: a total read later is counted in failed
			}
			w.health.fails++
			w.health.total++
			w.health.last = err.Error()
		}
		w.mu.Unlock()
	}
}
