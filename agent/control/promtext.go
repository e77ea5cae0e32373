package control

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// exposition builds a scrape in the Prometheus text format (version 0.0.4),
// which every Prometheus-compatible scraper reads. Samples may be added in
// any order; Bytes writes each family once, in the order first declared,
// with its HELP and TYPE lines. It replaces the Prometheus client library,
// which cost the agent ~2.3 MB of resident memory (BENCHMARKS.md, "Agent
// memory") for a handful of gauges and counters. Not safe for concurrent use.
type exposition struct {
	order []string
	fams  map[string]*family
}

type family struct {
	name, typ, help string
	lines           bytes.Buffer
}

// declare registers a family; typ is gauge, counter or histogram.
func (e *exposition) declare(name, typ, help string) {
	if e.fams == nil {
		e.fams = map[string]*family{}
	}
	if _, ok := e.fams[name]; !ok {
		e.order = append(e.order, name)
		e.fams[name] = &family{name: name, typ: typ, help: help}
	}
}

// add adds a sample of a declared family; labels are name, value pairs.
// suffix is "" or, for a histogram, _bucket, _sum or _count.
func (e *exposition) add(name, suffix string, v float64, labels ...string) {
	f := e.fams[name]
	if f == nil {
		panic("exposition: undeclared family " + name) // a programming error
	}
	b := &f.lines
	b.WriteString(name + suffix)
	if len(labels) > 0 {
		b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(labels[i])
			b.WriteString(`="`)
			b.WriteString(labelEscaper.Replace(labels[i+1]))
			b.WriteByte('"')
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(formatValue(v))
	b.WriteByte('\n')
}

// histogram adds a histogram with cumulative bucket counts (counts[i] for
// upper bound bounds[i]), its sum and count.
func (e *exposition) histogram(name string, bounds []float64, counts []uint64, sum float64, count uint64, labels ...string) {
	for i, le := range bounds {
		var c uint64
		if i < len(counts) {
			c = counts[i]
		}
		e.add(name, "_bucket", float64(c), append(labels, "le", formatValue(le))...)
	}
	e.add(name, "_bucket", float64(count), append(labels, "le", "+Inf")...)
	e.add(name, "_sum", sum, labels...)
	e.add(name, "_count", float64(count), labels...)
}

// Bytes is the scrape; families without samples are left out.
func (e *exposition) Bytes() []byte {
	var b bytes.Buffer
	for _, n := range e.order {
		f := e.fams[n]
		if f.lines.Len() == 0 {
			continue
		}
		b.WriteString("# HELP " + n + " " + helpEscaper.Replace(f.help) + "\n")
		b.WriteString("# TYPE " + n + " " + f.typ + "\n")
		b.Write(f.lines.Bytes())
	}
	return b.Bytes()
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
