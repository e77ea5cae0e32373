package control

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Samples added app by app come out grouped by family, escaped, and parse
// with Prometheus's own text parser.
func TestExpositionParses(t *testing.T) {
	e := &exposition{}
	e.declare("x_state", "gauge", "A state.\nSecond line with a \\.")
	e.declare("x_total", "counter", "A counter.")
	e.declare("x_seconds", "histogram", "A histogram.")
	e.declare("x_unused", "gauge", "No samples.")
	for _, app := range []string{"web", `we"ird\app` + "\n"} {
		e.add("x_state", "", 1, "app", app, "state", "running")
		e.add("x_total", "", 3, "app", app)
		e.histogram("x_seconds", []float64{0.5, 1}, []uint64{1, 2}, 1.75, 3, "app", app)
	}
	e.add("x_state", "", math.Inf(1), "app", "inf")
	out := e.Bytes()
	if n := bytes.Count(out, []byte("# TYPE x_state gauge\n")); n != 1 {
		t.Fatalf("TYPE of x_state %d times, want 1:\n%s", n, out)
	}
	if bytes.Contains(out, []byte("x_unused")) {
		t.Errorf("a family without samples is listed:\n%s", out)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, out)
	}
	if got := mfs["x_state"].GetHelp(); got != "A state.\nSecond line with a \\." {
		t.Errorf("help %q", got)
	}
	if n := len(mfs["x_state"].GetMetric()); n != 3 {
		t.Errorf("x_state has %d samples, want 3", n)
	}
	for _, m := range mfs["x_seconds"].GetMetric() {
		h := m.GetHistogram()
		app := m.GetLabel()[0].GetValue()
		if h.GetSampleCount() != 3 || h.GetSampleSum() != 1.75 || len(h.GetBucket()) != 3 || h.GetBucket()[1].GetCumulativeCount() != 2 || !math.IsInf(h.GetBucket()[2].GetUpperBound(), 1) {
			t.Errorf("histogram of %q: %v", app, h)
		}
		if app != "web" && app != `we"ird\app`+"\n" {
			t.Errorf("label value %q", app)
		}
	}
	if !strings.Contains(string(out), `x_state{app="inf"} +Inf`) {
		t.Errorf("+Inf not written as +Inf:\n%s", out)
	}
}
