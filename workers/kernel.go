package workers

import (
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/procunit"
)

// kernelSaid records and logs, once the worker exited and before its unit
// is ended, what the kernel did to it under its limits (procunit.Stats):
// an OOM kill at memory_max with the app's last lines, forks refused at
// pids_max, periods throttled by cpu_max.
func (w *Worker) kernelSaid(log hclog.Logger, st procunit.Stats) {
	w.mu.Lock()
	w.kernel = st
	w.mu.Unlock()
	if log == nil {
		return
	}
	if st.OOMKills > 0 {
		log.Error("the kernel's OOM killer killed the worker at memory_max", "worker", w.Slot, "pid", w.PID,
			"oom_kills", st.OOMKills, "memory", st.MemoryBytes, "memory_max", w.spec.Limits.MemoryMax,
			"last_lines", strings.Join(w.LastLines(), "\n"))
	}
	if st.ForksRefused > 0 {
		log.Warn("the kernel refused the worker's forks at pids_max", "worker", w.Slot, "pid", w.PID,
			"refused", st.ForksRefused, "pids_max", w.spec.Limits.PidsMax)
	}
	if st.Throttled > 0 {
		log.Info("the worker's CPU was throttled at cpu_max", "worker", w.Slot, "pid", w.PID,
			"periods", st.Throttled, "cpu_max_percent", w.spec.Limits.CPUMax)
	}
}

// kernelNote is what the kernel did, for ExitDescription; "" for nothing.
// Called with w.mu held.
func (w *Worker) kernelNote() string {
	if w.kernel.OOMKills > 0 {
		return fmt.Sprintf(" (the kernel's OOM killer at memory_max: %d kill(s))", w.kernel.OOMKills)
	}
	return ""
}
