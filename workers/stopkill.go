package workers

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/boundedfile"
)

// A worker still running at stop_timeout gets SIGKILL (awaitStop): the
// configured bound, not a fault. But "signal: killed" alone does not tell
// a drain that waited on something (a connection, a timer of the app's
// own) from one that had what to do and no CPU to do it on: on a loaded
// machine a Python server's exit needs half a second of CPU and took 15 s
// of wall time (issue 40, RELIABILITY.md). So the kill is logged with what
// the kernel counted for the worker's processes since the stop signal
// (/proc/PID/task/TID/schedstat): time on a CPU, and time runnable but
// waiting for one; and the exit says it came at stop_timeout.

// schedTimes is what schedstat says of a set of threads: nanoseconds on a
// CPU and waiting on a run queue, by thread id.
type schedTimes map[int][2]uint64

// treeSched reads schedstat for every thread of pid's process tree;
// threads it cannot read are left out (gone, or not ours to read).
func treeSched(pid int) schedTimes {
	st := schedTimes{}
	if pid <= 0 {
		return st
	}
	for _, p := range processTree(pid) {
		dir := "/proc/" + strconv.Itoa(p) + "/task/"
		tasks, _ := os.ReadDir(dir)
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			b, err := boundedfile.ReadFile(dir+t.Name()+"/schedstat", boundedfile.Options{Max: 256})
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) < 2 {
				continue
			}
			run, err1 := strconv.ParseUint(f[0], 10, 64)
			wait, err2 := strconv.ParseUint(f[1], 10, 64)
			if err1 == nil && err2 == nil {
				st[tid] = [2]uint64{run, wait}
			}
		}
	}
	return st
}

// since is how long the threads of now ran and waited for a CPU after
// before was read (a thread started since counts whole). Threads that
// ended in between are not counted: their time is lost with them.
func (now schedTimes) since(before schedTimes) (ran, waited time.Duration) {
	for tid, t := range now {
		b := before[tid]
		if t[0] >= b[0] && t[1] >= b[1] {
			ran += time.Duration(t[0] - b[0])
			waited += time.Duration(t[1] - b[1])
		}
	}
	return ran, waited
}

// logStopKill says why the worker was killed: stop_timeout passed after
// its stop signal, with its processes' CPU figures since then.
func (w *Worker) logStopKill(log hclog.Logger, before schedTimes) {
	if log == nil {
		return
	}
	ran, waited := treeSched(w.PID).since(before)
	log.Warn("worker still ran at stop_timeout after its stop signal; killed its process group",
		"worker", w.Slot, "pid", w.PID, "release", w.Release, "stop_timeout", w.spec.StopTimeout,
		"processes", len(processTree(w.PID)), "cpu_ran", ran.Round(time.Millisecond),
		"cpu_waited", waited.Round(time.Millisecond))
}
