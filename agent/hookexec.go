package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers/logs"
)

// execHook runs h and waits for it, at most its timeout (then SIGTERM to
// every process of its unit, and SIGKILL after hookKillGrace). It fills
// res's exit status and last lines; the error says why it failed.
//
// A hook runs as a tracked unit (internal/procunit: a cgroup where the
// agent can make one, else its process group and a sweep for a marker
// variable): whatever it started and left running when it exits (a
// daemon, a background job) is killed then, and the hook fails with a
// message that names each process left.
func execHook(rt *appRT, app *config.App, h *hookRun, res *api.HookResult) error {
	res.ExitStatus = "not started"
	cred, err := credential(app)
	if err != nil {
		return fmt.Errorf("could not start: %w", err)
	}
	o, err := newHookOutput(rt, app, h)
	if err != nil {
		return fmt.Errorf("could not start: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	defer cancel()
	// The unit, once started, for the timeout's stop (exec.Cmd may call
	// Cancel before Start has returned it).
	var started atomic.Pointer[procunit.Unit]
	killer := time.AfterFunc(time.Hour, func() {
		kctx, kcancel := context.WithTimeout(context.Background(), hookKillGrace)
		defer kcancel()
		if u := started.Load(); u != nil {
			_ = u.Kill(kctx)
		}
	})
	killer.Stop()
	defer killer.Stop()
	cmd, unit, err := procunit.Start("hook-"+app.Name+"-"+h.name, func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, h.argv[0], h.argv[1:]...)
		cmd.Dir = h.dir
		cmd.Env = append(appEnv(app),
			"DEPLOYD_APP="+app.Name, "DEPLOYD_RELEASE="+h.version, "DEPLOYD_PREVIOUS_RELEASE="+h.previous,
			"DEPLOYD_RELEASE_DIR="+h.dir, "DEPLOYD_HOOK="+h.name, "DEPLOYD_OPERATION="+h.op)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Stdout, cmd.Stderr = o.outW, o.errW
		cmd.Cancel = func() error {
			killer.Reset(hookKillGrace)
			if u := started.Load(); u != nil {
				u.Signal(syscall.SIGTERM)
			}
			return nil
		}
		// A backstop: exec.Cmd kills the hook itself this long after its
		// time is up if it still runs.
		cmd.WaitDelay = hookKillGrace + time.Second
		return cmd
	})
	pid := 0
	if err == nil {
		pid = cmd.Process.Pid
		started.Store(unit)
	}
	o.pid.store(pid) // the output lines waited for it
	o.read()
	if err != nil {
		res.LastLines = o.finish()
		return fmt.Errorf("could not start: %w", err)
	}
	err = cmd.Wait()
	killer.Stop()
	left, endErr := endHookUnit(unit, rt, h.name)
	res.LastLines = o.finish()
	var ee *exec.ExitError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		res.ExitStatus = fmt.Sprintf("timed out after %s", h.timeout)
		return fmt.Errorf("timed out after %s (%s_timeout) and was stopped", h.timeout, h.name)
	case errors.As(err, &ee):
		res.ExitStatus = ee.ProcessState.String()
		return fmt.Errorf("failed: %s", res.ExitStatus)
	case err != nil:
		res.ExitStatus = "exit status 0"
		return fmt.Errorf("failed: %w", err)
	}
	res.ExitStatus = "exit status 0"
	return leftError(left, endErr)
}

// leftError is the failure of a hook that exited 0 but left processes
// running (nil when it left none).
func leftError(left []procunit.Proc, endErr error) error {
	if len(left) == 0 {
		return nil
	}
	names := make([]string, len(left))
	for i, p := range left {
		names[i] = p.String()
	}
	what := "it was killed"
	if len(left) > 1 {
		what = "they were killed"
	}
	if endErr != nil {
		what = "killing it failed: " + endErr.Error()
	}
	return fmt.Errorf("left %s running (%s); a hook must not leave processes behind: run a daemon as an app of its own",
		strings.Join(names, ", "), what)
}

// endHookUnit kills what a hook left running once it exited, and waits
// until it is gone (bounded by hookKillGrace); it logs what it killed.
func endHookUnit(u *procunit.Unit, rt *appRT, hook string) ([]procunit.Proc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), hookKillGrace)
	defer cancel()
	left, err := u.End(ctx)
	for _, p := range left {
		rt.log.Warn("hook left a process running; killed", "hook", hook, "pid", p.PID, "command", p.Name,
			"tracked_by", u.Mode())
	}
	if err != nil {
		rt.log.Error("hook left processes that could not be killed", "hook", hook, "error", err)
	}
	return left, err
}

// hookOutput is a hook's stdout and stderr: pipes of the agent's own
// (*os.File, so exec.Cmd copies nothing and Wait returns when the hook
// exits, whoever else holds them), read line by line into the app's log
// and a tail until every writer is gone with the hook's unit.
type hookOutput struct {
	outR, outW, errR, errW *os.File
	out, err               *hookLines
	tail                   *logs.Tail
	pid                    *hookPID
	readers                sync.WaitGroup
}

func newHookOutput(rt *appRT, app *config.App, h *hookRun) (*hookOutput, error) {
	o := &hookOutput{tail: logs.NewTail(hookTailLines), pid: newHookPID()}
	var err error
	if o.outR, o.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if o.errR, o.errW, err = os.Pipe(); err != nil {
		closeAll([]*os.File{o.outR, o.outW})
		return nil, err
	}
	o.out = &hookLines{sink: rt.out, app: app.Name, stream: "out", prefix: "hook " + h.name + ": ", tail: o.tail, pid: o.pid}
	o.err = &hookLines{sink: rt.err, app: app.Name, stream: "err", prefix: o.out.prefix, tail: o.tail, pid: o.pid}
	return o, nil
}

// read closes the write ends (the hook has its copies, or never started)
// and starts the readers.
func (o *hookOutput) read() {
	closeAll([]*os.File{o.outW, o.errW})
	o.readers.Go(func() { _, _ = io.Copy(o.out, o.outR) })
	o.readers.Go(func() { _, _ = io.Copy(o.err, o.errR) })
}

// finish waits for the readers (at most a second: a process that escaped
// the unit, as a root hook can leave its cgroup, must not hold the result
// up), closes the pipes and returns the last lines.
func (o *hookOutput) finish() []string {
	done := make(chan struct{})
	go func() { o.readers.Wait(); close(done) }()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	closeAll([]*os.File{o.outR, o.errR}) // ends a read still blocked
	<-done
	o.out.flush()
	o.err.flush()
	return o.tail.Lines()
}
