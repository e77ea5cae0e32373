package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/procfs"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

// MetricsPath is where the metrics server answers.
const MetricsPath = "/metrics"

// metricsServer serves Prometheus metrics on [agent] metrics. Its listener
// crosses an agent handoff (tableflip), so the new agent serves the same
// port without a gap.
type metricsServer struct {
	srv  *http.Server
	done chan struct{} // closed when Serve returned
	once sync.Once
}

// startMetrics starts the metrics server on addr; "" leaves metrics off. A
// busy address is an error (the agent does not start).
func (a *Agent) startMetrics(addr string) error {
	if addr == "" {
		return nil
	}
	ln, err := a.upg.Fds().Listener("tcp", addr) // from the previous agent
	if err == nil && ln == nil {
		ln, err = net.Listen("tcp", addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			return &handoff.AddrInUseError{URL: "[agent] metrics " + addr, Holder: handoff.Holder("tcp", addr), Err: err}
		}
		if err == nil {
			if err = a.upg.Fds().AddListener("tcp", addr, ln.(*net.TCPListener)); err != nil {
				ln.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("metrics %s: %w", addr, err)
	}
	log := a.log.Named("metrics")
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		newCollector(a),
	)
	errLog := log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	mux := http.NewServeMux()
	mux.Handle("GET "+MetricsPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: errLog, ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 4, Timeout: 15 * time.Second,
	}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "deployd %s: Prometheus metrics at %s\n", version.String(), MetricsPath)
	})
	m := &metricsServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: errLog},
		done: make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "error", err)
		}
	}()
	a.sys.metrics = m
	log.Info("serving Prometheus metrics", "address", ln.Addr().String(), "path", MetricsPath)
	return nil
}

// Stop stops the server (a scrape in flight gets 2 s to finish) and waits
// for it. Safe to call twice, and on nil.
func (m *metricsServer) Stop() {
	if m == nil {
		return
	}
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := m.srv.Shutdown(ctx); err != nil {
			m.srv.Close()
		}
	})
	<-m.done
}

// collector reads the agent's status at scrape time.
type collector struct {
	a  *Agent
	fs procfs.FS

	info, appState, appRelease, appDesired, appWorkers *prometheus.Desc
	restarts, reloads, reloadSeconds, droppedLines     *prometheus.Desc
	wInfo, wRSS, wCPU, wStart, wReady                  *prometheus.Desc
}

// Known states, exported as 0 when not current so that alerts can match them.
var (
	appStates = []string{string(workers.AppStarting), string(workers.AppRunning), string(workers.AppReloading),
		string(workers.AppCanary), string(workers.AppErrored), string(workers.AppStopping), string(workers.AppStopped), "no release"}
	workerStates = []string{string(workers.Starting), string(workers.Ready), string(workers.Draining),
		string(workers.Stopping), string(workers.Exited)}
)

func newCollector(a *Agent) *collector {
	fs, _ := procfs.NewDefaultFS()
	d := prometheus.NewDesc
	app, worker := []string{"app"}, []string{"app", "slot", "pid"}
	return &collector{
		a: a, fs: fs,
		info: d("deployd_agent_info", "The running agent (value 1), by version.", []string{"version"}, nil),
		appState: d("deployd_app_state", "1 for the app's current state, 0 for the others.",
			[]string{"app", "state"}, nil),
		appRelease: d("deployd_app_release_info", "The release the app's workers run or move to (value 1).",
			[]string{"app", "release"}, nil),
		appDesired: d("deployd_app_desired_workers", "Workers the app should run.", app, nil),
		appWorkers: d("deployd_app_workers", "Worker processes of the app by state (during a reload old and new ones).",
			[]string{"app", "state"}, nil),
		restarts: d("deployd_app_restarts_total", "Workers restarted after they exited on their own (crash restarts).",
			app, nil),
		reloads: d("deployd_app_reloads_total", "Finished reloads (reload, deploy, rollback) by outcome: done, "+
			"abandoned (the new version never got ready; the old one kept serving) or failed.",
			[]string{"app", "outcome"}, nil),
		reloadSeconds: d("deployd_app_reload_duration_seconds", "How long reloads took.", app, nil),
		droppedLines: d("deployd_app_log_lines_dropped_total",
			"Output lines of the app's workers the agent could not write to its log files.", app, nil),
		wInfo: d("deployd_worker_info", "A worker process (value 1) with its release, generation and state.",
			append(worker, "release", "generation", "state"), nil),
		wRSS:   d("deployd_worker_resident_memory_bytes", "Resident memory of the worker process.", worker, nil),
		wCPU:   d("deployd_worker_cpu_seconds_total", "User and system CPU time of the worker process.", worker, nil),
		wStart: d("deployd_worker_start_time_seconds", "When the worker started, in seconds since the epoch.", worker, nil),
		wReady: d("deployd_worker_ready_seconds", "How long the worker took from start to ready (only once ready).",
			worker, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.info, c.appState, c.appRelease, c.appDesired, c.appWorkers,
		c.restarts, c.reloads, c.reloadSeconds, c.droppedLines, c.wInfo, c.wRSS, c.wCPU, c.wStart, c.wReady} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one status snapshot per app.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	send(ch, c.info, prometheus.GaugeValue, 1, version.String())
	a := c.a
	for _, rt := range a.appList() {
		c.collectApp(ch, rt)
	}
}

// send sends a constant metric, or an invalid one that names the error.
func send(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}

func (c *collector) collectApp(ch chan<- prometheus.Metric, rt *appRT) {
	st, ctr := appStatus(rt), rt.sup.Counters()
	name := rt.name
	for _, s := range withCurrent(appStates, st.State) {
		send(ch, c.appState, prometheus.GaugeValue, b2f(s == st.State), name, s)
	}
	if st.Release != "" {
		send(ch, c.appRelease, prometheus.GaugeValue, 1, name, st.Release)
	}
	send(ch, c.appDesired, prometheus.GaugeValue, float64(st.Instances), name)
	send(ch, c.restarts, prometheus.CounterValue, float64(ctr.Restarts), name)
	send(ch, c.droppedLines, prometheus.CounterValue, float64(st.DroppedLogLines), name)
	var count uint64
	for _, o := range []string{workers.ReloadDone, workers.ReloadAbandoned, workers.ReloadFailed} {
		send(ch, c.reloads, prometheus.CounterValue, float64(ctr.Reloads[o]), name, o)
		count += ctr.Reloads[o]
	}
	buckets := map[float64]uint64{}
	for i, le := range workers.ReloadBucketBounds() {
		buckets[le] = ctr.ReloadBuckets[i]
	}
	h, err := prometheus.NewConstHistogram(c.reloadSeconds, count, ctr.ReloadSeconds, buckets, name)
	if err != nil {
		h = prometheus.NewInvalidMetric(c.reloadSeconds, err)
	}
	ch <- h

	byState := map[string]int{}
	seen := map[string]bool{}
	now := time.Now()
	for _, w := range st.Workers {
		byState[w.State]++
		slot, pid := strconv.Itoa(w.Slot), strconv.Itoa(w.PID)
		if w.PID == 0 || seen[slot+"/"+pid] {
			continue // a worker that could not be started has no process
		}
		seen[slot+"/"+pid] = true
		send(ch, c.wInfo, prometheus.GaugeValue, 1, name, slot, pid, w.Release, strconv.Itoa(w.Generation), w.State)
		send(ch, c.wRSS, prometheus.GaugeValue, float64(w.RSSBytes), name, slot, pid)
		if cpu, ok := c.cpuSeconds(w.PID); ok {
			send(ch, c.wCPU, prometheus.CounterValue, cpu, name, slot, pid)
		}
		started := now.Add(-time.Duration(w.UptimeSeconds * float64(time.Second)))
		send(ch, c.wStart, prometheus.GaugeValue, float64(started.UnixMilli())/1e3, name, slot, pid)
		if w.ReadyMillis > 0 {
			send(ch, c.wReady, prometheus.GaugeValue, float64(w.ReadyMillis)/1e3, name, slot, pid)
		}
	}
	states := append([]string(nil), workerStates...)
	for s := range byState {
		states = withCurrent(states, s)
	}
	for _, s := range states {
		send(ch, c.appWorkers, prometheus.GaugeValue, float64(byState[s]), name, s)
	}
}

// cpuSeconds reads the CPU time of pid from /proc.
func (c *collector) cpuSeconds(pid int) (float64, bool) {
	p, err := c.fs.Proc(pid)
	if err != nil {
		return 0, false
	}
	st, err := p.Stat()
	if err != nil {
		return 0, false
	}
	return st.CPUTime(), true
}

// withCurrent returns known plus cur when known lacks it.
func withCurrent(known []string, cur string) []string {
	if cur == "" || slices.Contains(known, cur) {
		return known
	}
	return append(slices.Clone(known), cur)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
