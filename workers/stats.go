package workers

import (
	"time"

	"github.com/deployd/deployd/internal/procstat"
)

// sampleInterval is how often the loop samples every worker's CPU and
// memory, and checks max_memory and the watchdog.
const sampleInterval = time.Second

// usage is a worker's resource use read from /proc.
type usage struct {
	// CPUPercent is over the interval between the last two samples (the
	// first: since the worker started); 100 = one core.
	CPUPercent float64
	RSSBytes   int64
}

// sample is a worker's usage as of one tick, with the raw CPU time it was
// computed from.
type sample struct {
	usage
	at  time.Time
	cpu float64 // seconds of CPU
}

// next reads /proc/PID/stat and returns the sample after prev (zero: none
// yet). ok is false when the process is gone.
func next(fs procstat.FS, w *Worker, prev sample) (sample, bool) {
	if w.PID <= 0 {
		return sample{}, false
	}
	st, err := fs.Stat(w.PID)
	if err != nil {
		return sample{}, false
	}
	now := sample{at: time.Now(), cpu: st.CPUSeconds()}
	now.RSSBytes = st.RSSBytes()
	if prev.at.IsZero() {
		prev = sample{at: w.Started}
	}
	if dt := now.at.Sub(prev.at).Seconds(); dt > 0 {
		now.CPUPercent = 100 * (now.cpu - prev.cpu) / dt
	}
	return now, true
}

// sampleAll takes this tick's sample of every worker; the only writer of
// st.usage besides sampleOne. Run by the loop.
func (st *state) sampleAll(fs procstat.FS) {
	seen := make(map[*Worker]bool, len(st.usage))
	for _, w := range st.workers() {
		seen[w] = true
		if u, ok := next(fs, w, st.usage[w]); ok {
			st.usage[w] = u
		}
	}
	for w := range st.usage {
		if !seen[w] {
			delete(st.usage, w)
		}
	}
}

// resample takes a new sample of w now, continuing its series: the loop
// does when w gets ready, so that status shows the memory of a running app
// rather than of a process that just started. Run by the loop.
func (st *state) resample(fs procstat.FS, w *Worker) {
	if u, ok := next(fs, w, st.usage[w]); ok {
		st.usage[w] = u
	}
}

// sampleOne takes the first sample of a worker that joined the pool, so
// that status shows its memory before the next tick. Run by the loop.
func (st *state) sampleOne(fs procstat.FS, w *Worker) {
	if u, ok := next(fs, w, sample{}); ok {
		st.usage[w] = u
	}
}
