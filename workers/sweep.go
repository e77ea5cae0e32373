package workers

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/procunit"
)

// A worker's process group is not all it may leave behind: a child that
// calls setsid (a daemonizing library, `nohup setsid`) leaves the group
// and its session, and would live on after the worker with the listening
// sockets and output pipes it inherited — serving the old release after a
// reload. Each worker therefore runs as a procunit unit (a cgroup of its
// own under the agent's, or its process group plus a sweep of /proc for
// its marker variable), and once its main process is gone, whatever is
// left in the unit is killed and named in the log. The unit's Record
// crosses with the worker to the next agent (Handover, Process), which
// finds it again; an upgrade never removes or empties it.

// sweepTimeout bounds the kill of what a worker left running.
const sweepTimeout = 5 * time.Second

// sweep kills what the worker left running once its main process exited
// (exitedAt) and was reaped, and logs each process it killed; then its
// process group, the whole of what a worker without a unit has.
func (w *Worker) sweep(log hclog.Logger, exitedAt time.Time) {
	if w.unit != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
		left, err := w.unit.End(ctx)
		cancel()
		cause := "crash"
		if s := w.State(); s == Draining || s == Stopping {
			cause = "stop"
		}
		if log != nil {
			for _, p := range left {
				log.Warn("worker exited and left a process running; killed it", "worker", w.Slot,
					"worker_pid", w.PID, "pid", p.PID, "command", p.Name, "cause", cause,
					"tracked_by", w.unit.Mode(), "after", time.Since(exitedAt).Round(time.Microsecond))
			}
			if len(left) > 0 && cause == "crash" {
				log.Warn("killed what the crashed worker left running before its slot restarts", "worker", w.Slot,
					"worker_pid", w.PID, "processes", len(left))
			}
			if err != nil {
				log.Error("worker left processes that could not be killed", "worker", w.Slot, "worker_pid", w.PID,
					"error", err)
			}
		}
	}
	w.killGroup()
}

// unitRecord describes the worker's unit for the next agent, nil without.
func (w *Worker) unitRecord() *procunit.Record {
	if w.unit == nil {
		return nil
	}
	r := w.unit.Record()
	return &r
}
