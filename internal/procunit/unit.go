// Package procunit runs a command as a tracked unit: the command and every
// process it starts, daemons that left its session included, so that none
// outlives it unseen (the agent's hooks, and its workers, whose units a
// next agent finds again through a Record). Where the agent can make one, the unit is a cgroup v2
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
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
	// leader is a pidfd of the command, opened while its pid was known to
	// be the command's (Started: our unreaped child; Reopen: checked
	// against its start time): leaderHolds asks it whether the command
	// still holds its pid. nil when unknown or gone; closed by Close.
	leader *os.File
	name   string
	// v1 are the unit's cgroup v1 folders by controller (Limit), for the
	// limits its cgroup v2 has no controller for (a hybrid host).
	v1 map[string]string
}

// Proc is a process found in a unit.
type Proc struct {
	PID  int
	Name string // its command line, shortened
}

func (p Proc) String() string { return fmt.Sprintf("pid %d (%s)", p.PID, p.Name) }

// noCgroup, when set (tests), makes New use the sweep.
var noCgroup = false

// EnvNoCgroup, set to 1 in the agent's environment, makes every unit use
// the process group and marker sweep even where a cgroup could be made: a
// failpoint for tests of the fallback (a host without cgroup v2, or an
// agent that may not make a cgroup).
const EnvNoCgroup = "DEPLOYD_TEST_NO_CGROUP"

// New makes a unit named name (letters, digits, '-', '_', '.'), in a new
// cgroup when one can be made. Its command must start in a new process
// group with Env in its environment and, while CgroupFD says so, in the
// cgroup (clone3 CLONE_INTO_CGROUP: SysProcAttr.UseCgroupFD); then call
// Started with its pid, or DropCgroup when it could not start.
func New(name string) *Unit {
	var b [8]byte
	_, _ = rand.Read(b[:])
	u := &Unit{id: hex.EncodeToString(b[:]), name: name}
	if !noCgroup && os.Getenv(EnvNoCgroup) != "1" {
		u.cg = newCgroup(name + "-" + u.id[:8])
	}
	return u
}

// Env is the marker variable of the unit's processes, NAME=VALUE.
func (u *Unit) Env() string { return MarkerVar + "=" + u.id }

// CgroupFD is the open cgroup folder to start the command in; false when
// the unit has no cgroup (or the command started already).
func (u *Unit) CgroupFD() (int, bool) {
	if u.cg == nil || u.cg.fd < 0 {
		return 0, false
	}
	return u.cg.fd, true
}

// DropCgroup removes the unit's cgroup (a command that could not start in
// it, or not at all): the unit tracks by the sweep from now on.
func (u *Unit) DropCgroup() {
	if u.cg != nil {
		_ = u.cg.remove()
		u.cg = nil
	}
}

// Started records the unit's command, pid, once it started.
func (u *Unit) Started(pid int) {
	u.pgid, u.since = pid, startTime(pid)
	u.leader = openPidfd(pid) // our child, not reaped yet: it is the command
	if u.cg != nil {
		u.cg.closeFD()
	}
}

// openPidfd opens a pidfd of pid, nil when it cannot (gone, Linux < 5.3).
func openPidfd(pid int) *os.File {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
}

// Close releases the pidfd of the unit's command (End does too). Safe to
// call twice, and concurrently with the unit's other methods.
func (u *Unit) Close() {
	if u.leader != nil {
		_ = u.leader.Close()
	}
}

// Start starts the command build returns (its Stdout and Stderr should be
// *os.File, so that Wait returns when the command exits, not when the last
// holder of its output does) in a new unit named name (New): in a new
// process group, with MarkerVar added to its Env (os.Environ() when nil),
// in a new cgroup when one can be made. When the command cannot start in
// the cgroup (a kernel without clone3's CLONE_INTO_CGROUP), the cgroup is
// dropped and a second command from build starts tracked by the sweep.
func Start(name string, build func() *exec.Cmd) (*exec.Cmd, *Unit, error) {
	u := New(name)
	if fd, ok := u.CgroupFD(); ok {
		cmd := u.prepare(build())
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		if err := cmd.Start(); err == nil {
			u.Started(cmd.Process.Pid)
			return cmd, u, nil
		}
		u.DropCgroup()
	}
	cmd := u.prepare(build())
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	u.Started(cmd.Process.Pid)
	return cmd, u, nil
}

// prepare puts cmd in its own process group and marks its environment.
func (u *Unit) prepare(cmd *exec.Cmd) *exec.Cmd {
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, u.Env())
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return cmd
}

// Record is what finds a started unit again from another process (an
// agent that adopts a worker after an upgrade or a crash): it crosses as
// JSON.
type Record struct {
	ID string `json:"id"`
	// Cgroup is the cgroup folder, "" for a unit tracked by the sweep.
	Cgroup string `json:"cgroup,omitempty"`
	PGID   int    `json:"pgid"`
	Since  uint64 `json:"since"`
	// V1 are the unit's cgroup v1 folders by controller (limits on a
	// hybrid host), nil without.
	V1 map[string]string `json:"v1,omitempty"`
}

// Record describes u for Reopen.
func (u *Unit) Record() Record {
	r := Record{ID: u.id, PGID: u.pgid, Since: u.since}
	for c, dir := range u.v1 {
		if r.V1 == nil {
			r.V1 = map[string]string{}
		}
		r.V1[c] = dir
	}
	if u.cg != nil {
		r.Cgroup = u.cg.dir
	}
	return r
}

// Find describes the unit that process pid leads, found without a record
// (a worker a dead agent never recorded): id is the marker in its
// environment, its cgroup the one it is in when that is a unit's.
func Find(pid int, id string) Record {
	r := Record{ID: id, PGID: pid, Since: startTime(pid)}
	if dir := cgroupDir(strconv.Itoa(pid)); unitsCgroup(dir, id) {
		r.Cgroup = dir
	}
	return r
}

// unitsCgroup reports whether dir is the cgroup New made for the unit id:
// "deployd-NAME-" and the id's first 8 characters, never another folder
// that happens to start with "deployd-" (a service named deployd-blue).
func unitsCgroup(dir, id string) bool {
	base := filepath.Base(dir)
	return filepath.IsAbs(dir) && len(id) >= 8 && strings.HasPrefix(base, "deployd-") && strings.HasSuffix(base, "-"+id[:8])
}

// Reopen is the unit r describes. A cgroup that is gone (removed when its
// last process left, by an agent or a service manager) or that is not a
// unit's folder leaves the unit to the sweep; so does a record without
// one. Nothing is created or changed.
func Reopen(r Record) *Unit {
	u := &Unit{id: r.ID, pgid: r.PGID, since: r.Since}
	// The command's pidfd, if the pid is still the command's: checked
	// after the open, so that a pid reused in between fails the check.
	if f := openPidfd(r.PGID); f != nil {
		if r.Since != 0 && startTime(r.PGID) == r.Since {
			u.leader = f
		} else {
			f.Close()
		}
	}
	if r.Cgroup != "" && unitsCgroup(r.Cgroup, r.ID) {
		if _, err := os.Stat(filepath.Join(r.Cgroup, "cgroup.procs")); err == nil {
			u.cg = &cgroup{dir: r.Cgroup, fd: -1}
		}
	}
	for c, dir := range r.V1 {
		if v1Unit(dir, r.ID) {
			if u.v1 == nil {
				u.v1 = map[string]string{}
			}
			u.v1[c] = dir
		}
	}
	return u
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
		// A cgroup lists a zombie until its parent reaps it: it runs no more.
		if u.cg == nil || !exited(pid) {
			out = append(out, Proc{PID: pid, Name: cmdline(pid)})
		}
	}
	return out
}

// Has reports whether live process pid belongs to the unit now: a caller
// that opened a pidfd for a pid Procs listed checks it against reuse.
func (u *Unit) Has(pid int) bool {
	if u.cg != nil {
		return cgroupDir(strconv.Itoa(pid)) == u.cg.dir && !exited(pid)
	}
	return u.member(pid, []byte(MarkerVar+"="+u.id))
}

// Signal sends sig to every process of the unit (a polite stop before
// Kill), each through a pidfd checked against the unit once open
// (openMember): never to a pid or a process group id, which, once the
// command was reaped, may name someone else's process.
func (u *Unit) Signal(sig syscall.Signal) {
	for _, p := range u.Procs() {
		if fd, err := u.openMember(p.PID); err == nil {
			_ = unix.PidfdSendSignal(fd, sig, nil, 0)
			unix.Close(fd)
		}
	}
}

// errNotMember: the pid no longer names a process of the unit.
var errNotMember = errors.New("procunit: not a process of the unit")

// errNoPidfd: without pidfds (Linux < 5.3) a process that is not the
// caller's child cannot be signalled without the risk that its pid was
// reused in between, so it is not signalled at all.
var errNoPidfd = errors.New("procunit: no pidfd_open (Linux < 5.3): a process that is not the agent's child " +
	"cannot be signalled without risking a reused pid")

// openMember opens a pidfd for pid and then checks that pid is a live
// process of the unit: from then on the pidfd names that process, whatever
// becomes of the pid. Checked after the open, so that a pid reused in
// between fails the check (the pidfd then names the new process, which is
// not the unit's).
func (u *Unit) openMember(pid int) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) {
		return -1, errNoPidfd
	}
	if err != nil {
		return -1, fmt.Errorf("procunit: pidfd_open %d: %w", pid, err)
	}
	if !u.Has(pid) {
		unix.Close(fd)
		return -1, errNotMember
	}
	return fd, nil
}

// End kills what is left of the unit once its command has exited (before
// its reap, the sweep still counts the command's process group), waits
// until it is gone (at most until ctx ends), removes the cgroup and closes
// the unit (Close). It returns what was left (nil when the command left
// nothing) and an error when something could not be killed in time.
func (u *Unit) End(ctx context.Context) ([]Proc, error) {
	defer u.Close()
	left, err := u.end(ctx)
	if err != nil {
		return left, err
	}
	return left, u.removeV1(ctx)
}

func (u *Unit) end(ctx context.Context) ([]Proc, error) {
	left := u.Procs()
	if u.cg != nil {
		if len(left) > 0 {
			if err := u.cg.kill(ctx); err != nil {
				return left, err
			}
		}
		return left, u.cg.removeWhenEmpty(ctx)
	}
	// The members the sweep found, each checked, not the group id: once the
	// command is gone, its group may be empty and its id someone else's.
	if len(left) == 0 {
		return nil, nil
	}
	return left, u.killSweep(ctx)
}

// Kill kills every process of the unit now (the command included) and
// waits until they are gone, at most until ctx ends: cgroup.kill, or each
// process of the sweep through a checked pidfd, never the group id. The
// cgroup stays until End.
func (u *Unit) Kill(ctx context.Context) error {
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
