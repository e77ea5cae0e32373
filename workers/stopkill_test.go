package workers

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"

	"github.com/hashicorp/go-hclog"
)

// An old worker killed at stop_timeout says so: its exit ("signal:
// killed at stop_timeout (…)", the exited event's message) and a warning
// in the agent's log with what its processes did since the stop signal —
// time on a CPU and time waiting for one — which tells a drain that
// waited on something from one a loaded machine starved (issue 40: a
// gunicorn that needed 0.5 s of CPU to exit took 15 s at load 60, and
// the log said nothing of why it was killed). One that exits on its own
// says nothing of the kind.
func TestStopTimeoutKillSaysWhy(t *testing.T) {
	t.Parallel()
	var logs syncbuf.Buffer
	spec := testSpec(t, newListener(t), "ignore-term", 1)
	spec.StopTimeout = 500 * time.Millisecond
	s := New(Options{App: "web", Shim: testBinary(t), Logger: hclog.New(&hclog.LoggerOptions{
		Output: &logs, Level: hclog.Info})}, spec)
	t.Cleanup(s.Stop)
	mustStart(t, s)
	old := currentWorkers(s)[0]
	if err := s.Reload(nextSpec(spec, "serve-ready"), Rolling, nil); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	waitChan(t, "the old worker to be killed", old.Done())

	want := fmt.Sprintf("signal: killed at stop_timeout (%s)", spec.StopTimeout)
	if got := old.stopDescription(); !strings.HasPrefix(got, want) {
		t.Errorf("old worker ended with %q, want %q", got, want)
	}
	line := regexp.MustCompile(`killed its process group: .*pid=` + fmt.Sprint(old.PID) +
		` .*stop_timeout=500ms processes=\d+ cpu_ran=(\S+) cpu_waited=(\S+)`).FindStringSubmatch(logs.String())
	if line == nil {
		t.Fatalf("no log line says why pid %d was killed:\n%s", old.PID, logs.String())
	}
	ran, err1 := time.ParseDuration(line[1])
	waited, err2 := time.ParseDuration(line[2])
	if err1 != nil || err2 != nil || ran+waited > spec.StopTimeout+time.Second {
		t.Errorf("cpu_ran %q, cpu_waited %q: want durations within the %s since the stop signal",
			line[1], line[2], spec.StopTimeout)
	}

	// The new worker exits on its own at its stop signal: no such words.
	cur := currentWorkers(s)[0]
	s.Stop()
	if got := cur.stopDescription(); strings.Contains(got, "stop_timeout") || exitCode(cur) != 0 {
		t.Errorf("a worker that exited on its own ended with %q", got)
	}
	if n := strings.Count(logs.String(), "killed its process group"); n != 1 {
		t.Errorf("%d kills logged, want 1:\n%s", n, logs.String())
	}
}
