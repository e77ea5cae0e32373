package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The harness's deadlines: every control call a test makes through the
// harness ends in time, and a missed deadline dumps the agent's goroutines.

// StatusTimeout bounds one status call of the harness.
const StatusTimeout = 15 * time.Second

// callTimeout is the deadline of one CLI run.
func (a *Agent) callTimeout() time.Duration {
	if a.CallTimeout > 0 {
		return a.CallTimeout
	}
	return 3 * time.Minute
}

// Ctx is a context for one control call of a test: it ends after d (the
// harness's StatusTimeout when d is 0) or with the test.
func (a *Agent) Ctx(d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = StatusTimeout
	}
	return context.WithTimeout(context.Background(), d)
}

// Stuck fails the test after a control call missed its deadline: every
// agent process running this config gets SIGQUIT, which makes the Go
// runtime write all goroutines' stacks to the agent's log (and exit), and
// the log is printed.
func (a *Agent) Stuck(what string, err error) {
	a.t.Helper()
	pids := a.agentPIDs()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGQUIT)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	a.t.Fatalf("%s: no answer in time (%v); the agent's goroutines (SIGQUIT to %v) are in its log:\n%s", what, err, pids, a.failLog())
}

// agentPIDs are the pids of `deployd agent -c <this config>` processes
// (after upgrades, descendants of the one Start started), found in /proc.
func (a *Agent) agentPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) >= 4 && args[1] == "agent" && slices.Contains(args, a.Config) {
			out = append(out, pid)
		}
	}
	return out
}
