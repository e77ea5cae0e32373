package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// obs is one measured value.
type obs struct {
	scenario, system, metric string
	rep                      int
	v                        float64
}

// results collects every measurement of a run. Used by one goroutine.
type results struct {
	obs   []obs
	notes []string
	seen  map[string]bool
}

func (r *results) add(scn, sys, metric string, rep int, v float64) {
	r.obs = append(r.obs, obs{scn, sys, metric, rep, v})
}

// note records a remark for the report (distinct ones, at most 40).
func (r *results) note(s string) {
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	if r.seen[s] || len(r.notes) >= 40 {
		return
	}
	r.seen[s] = true
	r.notes = append(r.notes, s)
}

// vals returns every value of a metric, in the order measured.
func (r *results) vals(scn, sys, metric string) []float64 {
	var out []float64
	for _, o := range r.obs {
		if o.scenario == scn && o.system == sys && o.metric == metric {
			out = append(out, o.v)
		}
	}
	return out
}

// perRep returns the median of a metric within each repeat.
func (r *results) perRep(scn, sys, metric string) map[int]float64 {
	by := map[int][]float64{}
	for _, o := range r.obs {
		if o.scenario == scn && o.system == sys && o.metric == metric {
			by[o.rep] = append(by[o.rep], o.v)
		}
	}
	out := map[int]float64{}
	for rep, vs := range by {
		out[rep] = median(vs)
	}
	return out
}

// ratio returns a/b per repeat where both were measured (a and b: per-repeat medians).
func (r *results) ratio(scnA, sysA, metA, scnB, sysB, metB string) []float64 {
	a, b := r.perRep(scnA, sysA, metA), r.perRep(scnB, sysB, metB)
	var out []float64
	for rep, va := range a {
		if vb, ok := b[rep]; ok && vb != 0 {
			out = append(out, va/vb)
		}
	}
	return out
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func sum(vs []float64) float64 {
	t := 0.0
	for _, v := range vs {
		t += v
	}
	return t
}

// mmm formats min–median–max with format f, or the single value, or "–" for none.
func mmm(vs []float64, f string) string {
	switch len(vs) {
	case 0:
		return "–"
	case 1:
		return fmt.Sprintf(f, vs[0])
	}
	return fmt.Sprintf(f+" – "+f+" – "+f, slices.Min(vs), median(vs), slices.Max(vs))
}

// med formats the median with format f, or "–".
func med(vs []float64, f string) string {
	if len(vs) == 0 {
		return "–"
	}
	return fmt.Sprintf(f, median(vs))
}

// table is a Markdown table under construction.
type table struct {
	head []string
	rows [][]string
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) String() string {
	var sb strings.Builder
	line := func(cells []string) {
		sb.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	line(t.head)
	sep := make([]string, len(t.head))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range t.rows {
		line(r)
	}
	return sb.String()
}
