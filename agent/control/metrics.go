package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/internal/procstat"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

// MetricsPath is where the metrics server answers.
const MetricsPath = "/metrics"

// metricsServer serves Prometheus metrics on [agent] metrics. Its listener
// crosses an agent handoff (the core registers it with tableflip), so the
// new agent serves the same port without a gap.
type metricsServer struct {
	srv  *http.Server
	ln   net.Listener
	log  hclog.Logger
	done chan struct{} // closed when Serve returned
	once sync.Once
}

// newMetricsServer builds the metrics server of a on ln.
func newMetricsServer(a *agent.Agent, ln net.Listener, log hclog.Logger) *metricsServer {
	errLog := log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	mux := http.NewServeMux()
	mux.Handle("GET "+MetricsPath, newCollector(a))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "deployd %s: Prometheus metrics at %s\n", version.String(), MetricsPath)
	})
	return &metricsServer{
		// WriteTimeout: a scraper that stops reading keeps its scrape slot
		// (collector.inFlight) and the rendered answer no longer than that.
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: controlWriteTimeout,
			IdleTimeout: time.Minute, ErrorLog: errLog},
		ln: ln, log: log, done: make(chan struct{}),
	}
}

// start serves in the background until Stop. Nothing on nil.
func (m *metricsServer) start() {
	if m == nil {
		return
	}
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("metrics server stopped", "error", err)
		}
	}()
	m.log.Info("serving Prometheus metrics", "address", m.ln.Addr().String(), "path", MetricsPath)
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
	<-m.done // start runs in Serve, which the agent's run group always runs
}

// collector answers a scrape from the agent's status at that moment: one
// status snapshot per app, and the agent's own process and Go runtime
// figures under the names the Prometheus client uses (process_*, go_*).
type collector struct {
	a        *agent.Agent
	fs       procstat.FS
	inFlight chan struct{} // at most cap scrapes at once; more get 503
}

// Known states, exported as 0 when not current so that alerts can match them.
var (
	appStates = []string{string(workers.AppStarting), string(workers.AppRunning), string(workers.AppReloading),
		string(workers.AppCanary), string(workers.AppErrored), string(workers.AppStopping), string(workers.AppStopped), "no release"}
	workerStates = []string{string(workers.Starting), string(workers.Ready), string(workers.Draining),
		string(workers.Stopping), string(workers.Exited)}
)

// families are the agent's metric families, in the order a scrape lists them.
var families = [][3]string{
	{"deployd_agent_info", "gauge", "The running agent (value 1), by version."},
	{"deployd_app_state", "gauge", "1 for the app's current state, 0 for the others."},
	{"deployd_app_release_info", "gauge", "The release the app's workers run or move to (value 1)."},
	{"deployd_app_desired_workers", "gauge", "Workers the app should run."},
	{"deployd_app_workers", "gauge", "Worker processes of the app by state (during a reload old and new ones)."},
	{"deployd_app_restarts_total", "counter", "Workers restarted after they exited on their own (crash restarts)."},
	{"deployd_app_reloads_total", "counter", "Finished reloads (reload, deploy, rollback) by outcome: done, " +
		"abandoned (the new version never got ready; the old one kept serving) or failed."},
	{"deployd_app_reload_duration_seconds", "histogram", "How long reloads took."},
	{"deployd_app_log_lines_dropped_total", "counter",
		"Output lines of the app's workers the agent could not write to its log files."},
	{"deployd_app_health_check_failures_total", "counter",
		"Failed liveness checks ([apps.NAME.health]) of the app's workers, replaced ones included."},
	{"deployd_app_balance_info", "gauge", "How new connections reach the app's workers (value 1): the balance in effect " +
		"(shared, even or sticky) and the one the config asks for; they differ where the kernel could not steer."},
	{"deployd_app_spares", "gauge", "Spare workers the app keeps (balance even or sticky): on top of its workers, " +
		"given no connection until one takes the place of a worker that exited."},
	{"deployd_app_spares_ready", "gauge", "The app's spare workers that are ready to take a place."},
	{"deployd_listener_accept_queue", "gauge", "Connections waiting in a listener's accept queue for a worker to accept " +
		"them, read once a second; of a steered listener (balance even or sticky), the sum over its workers' own sockets."},
	{"deployd_listener_accept_backlog", "gauge", "How many connections may wait in a listener's accept queue before the " +
		"kernel refuses new ones; of a steered listener, the sum over its workers' own sockets."},
	{"deployd_worker_info", "gauge", "A worker process (value 1) with its release, generation and state."},
	{"deployd_worker_resident_memory_bytes", "gauge", "Resident memory of the worker process."},
	{"deployd_worker_cpu_seconds_total", "counter", "User and system CPU time of the worker process."},
	{"deployd_worker_start_time_seconds", "gauge", "When the worker started, in seconds since the epoch."},
	{"deployd_worker_ready_seconds", "gauge", "How long the worker took from start to ready (only once ready)."},
	{"deployd_worker_new_connections_total", "counter", "New connections kernel steering gave the worker since it " +
		"took its place (balance even or sticky; absent for a spare)."},
	{"deployd_worker_accept_queue", "gauge", "Connections waiting in the accept queue of the worker's own socket " +
		"(balance even or sticky), read once a second."},
	{"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."},
	{"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."},
	{"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."},
	{"process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds."},
	{"process_open_fds", "gauge", "Number of open file descriptors."},
	{"process_max_fds", "gauge", "Maximum number of open file descriptors."},
	{"go_info", "gauge", "Information about the Go environment."},
	{"go_goroutines", "gauge", "Number of goroutines that currently exist."},
	{"go_threads", "gauge", "Number of OS threads created."},
	{"go_memstats_heap_alloc_bytes", "gauge", "Number of heap bytes allocated and currently in use."},
	{"go_memstats_sys_bytes", "gauge", "Number of bytes obtained from system."},
}

func newCollector(a *agent.Agent) *collector {
	return &collector{a: a, inFlight: make(chan struct{}, 4)}
}

// ServeHTTP answers a scrape.
func (c *collector) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	select {
	case c.inFlight <- struct{}{}:
		defer func() { <-c.inFlight }()
	default:
		http.Error(w, "too many scrapes at once", http.StatusServiceUnavailable)
		return
	}
	b := c.collect()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

// collect builds one scrape.
func (c *collector) collect() []byte {
	e := &exposition{}
	for _, f := range families {
		e.declare(f[0], f[1], f[2])
	}
	e.add("deployd_agent_info", "", 1, "version", version.String())
	for _, f := range c.a.Figures() {
		c.collectApp(e, f)
	}
	c.collectSelf(e)
	return e.Bytes()
}

func (c *collector) collectApp(e *exposition, f agent.AppFigures) {
	st, ctr := f.Status, f.Counters
	name := st.Name
	for _, s := range withCurrent(appStates, st.State) {
		e.add("deployd_app_state", "", b2f(s == st.State), "app", name, "state", s)
	}
	if st.Release != "" {
		e.add("deployd_app_release_info", "", 1, "app", name, "release", st.Release)
	}
	e.add("deployd_app_desired_workers", "", float64(st.Instances), "app", name)
	e.add("deployd_app_restarts_total", "", float64(ctr.Restarts), "app", name)
	e.add("deployd_app_log_lines_dropped_total", "", float64(st.DroppedLogLines), "app", name)
	e.add("deployd_app_health_check_failures_total", "", float64(ctr.HealthCheckFailures), "app", name)
	collectBalance(e, f)
	var count uint64
	for _, o := range []string{workers.ReloadDone, workers.ReloadAbandoned, workers.ReloadFailed} {
		e.add("deployd_app_reloads_total", "", float64(ctr.Reloads[o]), "app", name, "outcome", o)
		count += ctr.Reloads[o]
	}
	e.histogram("deployd_app_reload_duration_seconds", workers.ReloadBucketBounds(), ctr.ReloadBuckets,
		ctr.ReloadSeconds, count, "app", name)

	byState := map[string]int{}
	seen := map[string]bool{}
	now := time.Now()
	// Old workers draining in the background count as draining workers.
	for _, w := range append(slices.Clone(st.Workers), st.Draining...) {
		byState[w.State]++
		slot, pid := strconv.Itoa(w.Slot), strconv.Itoa(w.PID)
		if w.PID == 0 || seen[slot+"/"+pid] {
			continue // a worker that could not be started has no process
		}
		seen[slot+"/"+pid] = true
		e.add("deployd_worker_info", "", 1, "app", name, "slot", slot, "pid", pid,
			"release", w.Release, "generation", strconv.Itoa(w.Generation), "state", w.State)
		e.add("deployd_worker_resident_memory_bytes", "", float64(w.RSSBytes), "app", name, "slot", slot, "pid", pid)
		if ps, err := c.fs.Stat(w.PID); err == nil {
			e.add("deployd_worker_cpu_seconds_total", "", ps.CPUSeconds(), "app", name, "slot", slot, "pid", pid)
		}
		started := now.Add(-time.Duration(w.UptimeSeconds * float64(time.Second)))
		e.add("deployd_worker_start_time_seconds", "", float64(started.UnixMilli())/1e3, "app", name, "slot", slot, "pid", pid)
		if w.ReadyMillis > 0 {
			e.add("deployd_worker_ready_seconds", "", float64(w.ReadyMillis)/1e3, "app", name, "slot", slot, "pid", pid)
		}
		if w.NewConnections != nil {
			e.add("deployd_worker_new_connections_total", "", float64(*w.NewConnections), "app", name, "slot", slot, "pid", pid)
		}
		if w.Queued != nil {
			e.add("deployd_worker_accept_queue", "", float64(*w.Queued), "app", name, "slot", slot, "pid", pid)
		}
	}
	states := append([]string(nil), workerStates...)
	for s := range byState {
		states = withCurrent(states, s)
	}
	for _, s := range states {
		e.add("deployd_app_workers", "", float64(byState[s]), "app", name, "state", s)
	}
}

// collectBalance adds how connections reach the app's workers: the
// balance, the spares and each listener's accept queue.
func collectBalance(e *exposition, f agent.AppFigures) {
	st := f.Status
	e.add("deployd_app_balance_info", "", 1, "app", st.Name, "balance", st.Balance, "asked", f.BalanceAsked)
	ready := 0
	for _, w := range st.Workers {
		if w.Spare && w.State == string(workers.Ready) {
			ready++
		}
	}
	// A reload's new workers wait out of the map like spares, and status
	// shows them so; the gauge counts no more than the app's own spares.
	ready = min(ready, st.Spares)
	e.add("deployd_app_spares", "", float64(st.Spares), "app", st.Name)
	e.add("deployd_app_spares_ready", "", float64(ready), "app", st.Name)
	for _, q := range st.AcceptQueues {
		e.add("deployd_listener_accept_queue", "", float64(q.Queued), "app", st.Name, "listen", q.Listen)
		e.add("deployd_listener_accept_backlog", "", float64(q.Backlog), "app", st.Name, "listen", q.Listen)
	}
}

// runtimeSamples are the runtime/metrics the go_* families are read from.
var runtimeSamples = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/total:bytes", "/sched/goroutines:goroutines"}

// collectSelf adds the agent's own process_* and go_* figures.
func (c *collector) collectSelf(e *exposition) {
	if ps, err := c.fs.Stat(0); err == nil {
		e.add("process_cpu_seconds_total", "", ps.CPUSeconds())
		e.add("process_resident_memory_bytes", "", float64(ps.RSSBytes()))
		e.add("process_virtual_memory_bytes", "", float64(ps.VSize))
		if boot, err := c.fs.BootTime(); err == nil {
			e.add("process_start_time_seconds", "", float64(boot)+ps.StartSeconds())
		}
		e.add("go_threads", "", float64(ps.NumThreads))
	}
	if n, err := c.fs.OpenFDs(); err == nil {
		e.add("process_open_fds", "", float64(n))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		e.add("process_max_fds", "", float64(lim.Cur))
	}
	e.add("go_info", "", 1, "version", runtime.Version())
	s := make([]metrics.Sample, len(runtimeSamples))
	for i, n := range runtimeSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	e.add("go_memstats_heap_alloc_bytes", "", float64(s[0].Value.Uint64()))
	e.add("go_memstats_sys_bytes", "", float64(s[1].Value.Uint64()))
	e.add("go_goroutines", "", float64(s[2].Value.Uint64()))
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
