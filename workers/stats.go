package workers

import (
	"time"

	"github.com/prometheus/procfs"
)

type cpuSample struct {
	at  time.Time
	cpu float64 // seconds of CPU
}

// Usage is a worker's resource use read from /proc.
type Usage struct {
	CPUPercent float64
	RSSBytes   int64
}

// usage reads /proc/PID/stat. CPU % is over the time since the previous
// call (or since start, on the first), 100 = one core.
func (w *Worker) usage(fs procfs.FS) Usage {
	p, err := fs.Proc(w.PID)
	if err != nil {
		return Usage{}
	}
	st, err := p.Stat()
	if err != nil {
		return Usage{}
	}
	now := time.Now()
	cpu := st.CPUTime()
	w.mu.Lock()
	prev := w.cpu
	w.cpu = cpuSample{at: now, cpu: cpu}
	w.mu.Unlock()
	if prev.at.IsZero() {
		prev = cpuSample{at: w.Started}
	}
	u := Usage{RSSBytes: int64(st.ResidentMemory())}
	if dt := now.Sub(prev.at).Seconds(); dt > 0 {
		u.CPUPercent = 100 * (cpu - prev.cpu) / dt
	}
	return u
}
