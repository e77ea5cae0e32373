// Package procunit runs a command as a tracked unit: the command and every
// process it starts, daemons that left its session included, so that none
// outlives it unseen. Where the agent can make one, the unit is a cgroup v2
// child of the agent's own cgroup, which the command starts in (clone3
// CLONE_INTO_CGROUP) and cgroup.kill empties at once; elsewhere it is the
// command's process group plus every process whose environment carries the
// unit's marker variable, found by a sweep of /proc and killed through
// pidfds.
package procunit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// MarkerVar is the variable that marks a unit's processes, set in the
// command's environment (a process that rewrites its environment escapes
// the sweep, not the cgroup).
const MarkerVar = "DEPLOYD_UNIT"

// Mode is how a unit tracks its processes.
type Mode string

// Modes.
const (
	ModeCgroup Mode = "cgroup"
	ModeSweep  Mode = "process group and marker sweep"
)

// Unit is a started command's unit. Its methods are safe for one caller
// at a time (the goroutine that runs the command).
type Unit struct {
	id   string
	pgid int
	// since is the command's start time (/proc/PID/stat): the sweep reads
	// the environment of younger processes alone.
	since uint64
	cg    *cgroup // nil: sweep mode
}

// Proc is a process found in a unit.
type Proc struct {
	PID  int
	Name string // its command line, shortened
}

func (p Proc) String() string { return fmt.Sprintf("pid %d (%s)", p.PID, p.Name) }

// noCgroup, when set (tests), makes Start use the sweep.
var noCgroup = false

// Start starts the command build returns (its Stdout and Stderr should be
// *os.File, so that Wait returns when the command exits, not when the last
// holder of its output does) in a new unit named name (letters, digits,
// '-', '_', '.'): in a new process group, with MarkerVar added to its Env
// (os.Environ() when nil), in a new cgroup when one can be made. When the
// command cannot start in the cgroup (a kernel without clone3's
// CLONE_INTO_CGROUP), the cgroup is dropped and a second command from
// build starts tracked by the sweep.
func Start(name string, build func() *exec.Cmd) (*exec.Cmd, *Unit, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	u := &Unit{id: hex.EncodeToString(b[:])}
	if !noCgroup {
		u.cg = newCgroup(name + "-" + u.id[:8])
	}
	if u.cg != nil {
		cmd := u.prepare(build())
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, u.cg.fd
		err := cmd.Start()
		if err == nil {
			u.pgid, u.since = cmd.Process.Pid, startTime(cmd.Process.Pid)
			u.cg.closeFD()
			return cmd, u, nil
		}
		_ = u.cg.remove()
		u.cg = nil
	}
	cmd := u.prepare(build())
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	u.pgid, u.since = cmd.Process.Pid, startTime(cmd.Process.Pid)
	return cmd, u, nil
}

// prepare puts cmd in its own process group and marks its environment.
func (u *Unit) prepare(cmd *exec.Cmd) *exec.Cmd {
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, MarkerVar+"="+u.id)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return cmd
}

// Mode says how u tracks its processes.
func (u *Unit) Mode() Mode {
	if u.cg != nil {
		return ModeCgroup
	}
	return ModeSweep
}

// Procs lists the unit's live processes (the command itself while it
// runs; once it was reaped, what it left behind).
func (u *Unit) Procs() []Proc {
	var pids []int
	if u.cg != nil {
		pids = u.cg.procs()
	} else {
		pids = u.sweep()
	}
	out := make([]Proc, 0, len(pids))
	for _, pid := range pids {
		out = append(out, Proc{PID: pid, Name: cmdline(pid)})
	}
	return out
}

// Signal sends sig to every process of the unit (a polite stop before
// Kill).
func (u *Unit) Signal(sig syscall.Signal) {
	_ = syscall.Kill(-u.pgid, sig)
	for _, p := range u.Procs() {
		_ = syscall.Kill(p.PID, sig)
	}
}

// End kills what is left of the unit once its command has exited and was
// reaped, waits until it is gone (at most until ctx ends) and removes the
// cgroup. It returns what was left (nil when the command left nothing)
// and an error when something could not be killed in time.
func (u *Unit) End(ctx context.Context) ([]Proc, error) {
	left := u.Procs()
	if u.cg != nil {
		if len(left) > 0 {
			if err := u.cg.kill(ctx); err != nil {
				return left, err
			}
		}
		return left, u.cg.remove()
	}
	_ = syscall.Kill(-u.pgid, syscall.SIGKILL)
	if len(left) == 0 {
		return nil, nil
	}
	return left, u.killSweep(ctx)
}

// Kill kills every process of the unit now (the command included) and
// waits until they are gone, at most until ctx ends. The cgroup stays
// until End.
func (u *Unit) Kill(ctx context.Context) error {
	_ = syscall.Kill(-u.pgid, syscall.SIGKILL)
	if u.cg != nil {
		return u.cg.kill(ctx)
	}
	return u.killSweep(ctx)
}

// cmdline is pid's command line, spaces between the arguments, at most
// 80 bytes; its name from stat when it has none.
func cmdline(pid int) string {
	b, err := readBounded("/proc/"+strconv.Itoa(pid)+"/cmdline", 4096)
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if err != nil || s == "" {
		if st, err := readBounded("/proc/"+strconv.Itoa(pid)+"/comm", 64); err == nil {
			s = strings.TrimSpace(string(st))
		}
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// readBounded reads at most max bytes of a /proc or /sys file.
func readBounded(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, max)
	n := 0
	for n < max {
		m, err := f.Read(b[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	return b[:n], nil
}
