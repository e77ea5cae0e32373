package logs

import (
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkSink measures Write through to the file (text format, with
// rotation), reporting lines/s; MB/s counts the workers' text bytes.
func BenchmarkSink(b *testing.B) {
	s, err := OpenSink(Options{Path: filepath.Join(b.TempDir(), "web.out.log"), MaxSize: 64 << 20, MaxFiles: 2})
	if err != nil {
		b.Fatal(err)
	}
	text := "GET /api/v1/users/42 200 1.234ms " + strings.Repeat("x", 60)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		s.Write(Line{App: "web", Slot: 2, PID: 4242, Stream: "out", Text: text})
		if i++; i%(DefaultBufferLines/2) == 0 { // stay within the queue
			flush(b, s)
		}
	}
	flush(b, s)
	b.StopTimer()
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "lines/s")
	if d := s.Dropped(); d != 0 {
		b.Errorf("dropped %d lines", d)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}
