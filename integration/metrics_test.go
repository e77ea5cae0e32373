package integration

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/deployd/deployd/agent/api"
)

// scrape fetches /metrics on port and parses it as Prometheus text.
func scrape(t *testing.T, port int) map[string]*dto.MetricFamily {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics are not valid Prometheus text: %v", err)
	}
	return mfs
}

// sample returns the value of metric name with the given labels (a subset);
// ok is false when there is none.
func sample(mfs map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

func mustSample(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	v, ok := sample(mfs, name, labels...)
	if !ok {
		t.Fatalf("metric %s%v missing", name, labels)
	}
	return v
}

// waitSample scrapes until metric name{labels} equals want.
func waitSample(t *testing.T, port int, want float64, name string, labels ...string) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		mfs := scrape(t, port)
		v, ok := sample(mfs, name, labels...)
		if ok && v == want {
			return mfs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v (present %v), want %v", name, labels, v, ok, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricsConfig turns metrics on (the body starts inside the harness's
// [agent] table) and runs two workers of the test app.
func metricsConfig(metricsPort, port int) string {
	return fmt.Sprintf("metrics = \"127.0.0.1:%d\"\n\n", metricsPort) + appConfig("web", port, 2, "")
}

func TestMetricsEndpointAndCountersMove(t *testing.T) {
	parallel(t)
	mport, port := FreePort(t), FreePort(t)
	a := StartAgent(t, bins, metricsConfig(mport, port))
	st := a.WaitFor("2 ready workers", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })

	mfs := scrape(t, mport)
	if v := mustSample(t, mfs, "deployd_agent_info", "version", "test-1"); v != 1 {
		t.Errorf("deployd_agent_info = %v", v)
	}
	if v := mustSample(t, mfs, "process_resident_memory_bytes"); v <= 0 {
		t.Errorf("agent RSS = %v", v)
	}
	if v := mustSample(t, mfs, "deployd_app_state", "app", "web", "state", "running"); v != 1 {
		t.Errorf("app state running = %v", v)
	}
	if v := mustSample(t, mfs, "deployd_app_workers", "app", "web", "state", "ready"); v != 2 {
		t.Errorf("ready workers = %v, want 2", v)
	}
	for _, w := range appOf(st, "web").Workers {
		pid := fmt.Sprint(w.PID)
		if v := mustSample(t, mfs, "deployd_worker_resident_memory_bytes", "app", "web", "pid", pid); v <= 0 {
			t.Errorf("worker %s RSS = %v", pid, v)
		}
		mustSample(t, mfs, "deployd_worker_cpu_seconds_total", "app", "web", "pid", pid)
		if v := mustSample(t, mfs, "deployd_worker_ready_seconds", "app", "web", "pid", pid); v <= 0 || v > 10 {
			t.Errorf("worker %s ready after %vs", pid, v)
		}
		if v := mustSample(t, mfs, "deployd_worker_info", "app", "web", "pid", pid, "state", "ready"); v != 1 {
			t.Errorf("worker %s info = %v", pid, v)
		}
	}
	mustSample(t, mfs, "deployd_app_log_lines_dropped_total", "app", "web")
	for name, want := range map[string]float64{"deployd_app_restarts_total": 0, "deployd_app_reload_duration_seconds": 0,
		"deployd_app_health_check_failures_total": 0} {
		if v := mustSample(t, mfs, name, "app", "web"); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := mustSample(t, mfs, "deployd_app_reloads_total", "app", "web", "outcome", "done"); v != 0 {
		t.Errorf("reloads before any = %v", v)
	}

	// A crash restart moves restarts_total.
	before := PIDs(appOf(st, "web"))
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.WaitFor("slot 0 replaced", 20*time.Second, func(st *api.Status) bool {
		p := PIDs(appOf(st, "web"))
		return AllReady(st, "web", 2) && p[0] != before[0] && p[0] != 0
	})
	waitSample(t, mport, 1, "deployd_app_restarts_total", "app", "web")

	// A reload moves reloads_total{outcome="done"} and the duration histogram.
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	mfs = waitSample(t, mport, 1, "deployd_app_reloads_total", "app", "web", "outcome", "done")
	if v := mustSample(t, mfs, "deployd_app_reload_duration_seconds", "app", "web"); v != 1 {
		t.Errorf("reload duration histogram count = %v, want 1", v)
	}
	h := mfs["deployd_app_reload_duration_seconds"].GetMetric()[0].GetHistogram()
	if h.GetSampleSum() <= 0 || h.GetSampleSum() > 60 {
		t.Errorf("reload duration sum = %v s", h.GetSampleSum())
	}
	if v := mustSample(t, mfs, "deployd_worker_info", "app", "web", "generation", "2"); v != 1 {
		t.Errorf("no worker of the reloaded generation in metrics")
	}

	// The metrics port crosses an agent handoff: the new agent serves it.
	oldPID := a.PID()
	a.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pid, _ := agentPID(t, a); pid != oldPID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new agent after SIGHUP\n%s", a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for Alive(oldPID) { // the old agent exits once it drained
		if time.Now().After(deadline) {
			t.Fatalf("old agent %d still running 30s after SIGHUP\n%s", oldPID, a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	mfs = scrape(t, mport)
	mustSample(t, mfs, "deployd_agent_info", "version", "test-1")

	// Stopped with the agent: the port is free again.
	a.Stop()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", mport))
	if err != nil {
		t.Fatalf("metrics port still taken after the agent stopped: %v", err)
	}
	ln.Close()
}

func TestMetricsPortBusyIsSetupError(t *testing.T) {
	parallel(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	mport := busy.Addr().(*net.TCPAddr).Port
	port := FreePort(t)
	code, out := runAgentExpectingFailure(t, metricsConfig(mport, port))
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, out)
	}
	want := fmt.Sprintf("[agent] metrics 127.0.0.1:%d is already in use by ", mport)
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	// Nothing was left listening on the app's port.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("app port still taken: %v", err)
	}
	ln.Close()
}
