// Package pidns lets a test run in a PID namespace of its own, where it
// chooses the pid the next process gets (ns_last_pid): how tests show that
// a pid freed by a reap, which the kernel may give to any new process, is
// never signalled. For tests only; it needs root.
package pidns

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envInside marks the run of a test inside its namespace.
const envInside = "DEPLOYD_TEST_IN_PIDNS"

// Enter reports whether the calling test runs in its own PID namespace,
// with /proc mounted for it: then the caller runs its scenario. Otherwise
// it runs the test again, alone, in a new PID and mount namespace (the
// test binary's pid 1 there), fails the test if that run fails, logs its
// output, and returns false; it skips the test when not root.
func Enter(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envInside) == "" {
		rerun(t)
		return false
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("pidns: make mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		t.Fatalf("pidns: mount the namespace's /proc: %v", err)
	}
	return true
}

// rerun runs t again in a new PID and mount namespace, within a minute.
func rerun(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace needs root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envInside+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	done := make(chan struct{})
	var out []byte
	go func() { defer close(done); out, err = cmd.CombinedOutput() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill() // pid 1 of the namespace: every process in it dies with it
		<-done
		t.Fatalf("pidns: the run in a PID namespace did not end within a minute:\n%s", out)
	}
	if err != nil {
		t.Fatalf("in a PID namespace: %v\n%s", err, out)
	}
	t.Logf("in a PID namespace:\n%s", out)
}

// Victim is a process group that got a pid freed by a reap: its leader and
// a member (`sleep`), watched through pidfds, killed when the test ends.
type Victim struct {
	PID   int
	procs []*os.Process
	fds   []int
}

// NewVictim starts, inside the namespace (Enter), a process that gets pid
// (free again: the process that had it was reaped) by setting ns_last_pid
// just before the fork, as the leader of a process group of its own, and
// a second process in that group. It returns nil when another process (a
// thread a runtime started) took pid first: the caller tries again.
func NewVictim(t *testing.T, pid int) *Victim {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	v := &Victim{PID: pid}
	t.Cleanup(v.kill)
	attr := &os.ProcAttr{Files: []*os.File{nil, os.Stdout, os.Stderr}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	argv := []string{sleep, "60"}
	if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
		t.Fatalf("pidns: set ns_last_pid: %v", err)
	}
	leader, err := os.StartProcess(sleep, argv, attr)
	if err != nil {
		t.Fatal(err)
	}
	v.add(t, leader)
	if leader.Pid != pid {
		t.Logf("pidns: the victim got pid %d, not %d (another process took it first)", leader.Pid, pid)
		v.kill()
		v.procs, v.fds = nil, nil
		return nil
	}
	attr.Sys = &syscall.SysProcAttr{Setpgid: true, Pgid: pid}
	member, err := os.StartProcess(sleep, argv, attr)
	if err != nil {
		t.Fatal(err)
	}
	v.add(t, member)
	return v
}

func (v *Victim) add(t *testing.T, p *os.Process) {
	t.Helper()
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		_ = p.Kill()
		_, _ = p.Wait()
		t.Fatal(err)
	}
	v.procs, v.fds = append(v.procs, p), append(v.fds, fd)
}

func (v *Victim) kill() {
	for i, p := range v.procs {
		_ = unix.PidfdSendSignal(v.fds[i], unix.SIGKILL, nil, 0)
		_, _ = p.Wait()
		unix.Close(v.fds[i])
	}
}

// MustSurvive fails the test if the victim's leader or member dies within
// d (now, when d <= 0).
func (v *Victim) MustSurvive(t *testing.T, d time.Duration) {
	t.Helper()
	pfds := make([]unix.PollFd, len(v.fds))
	for i, fd := range v.fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	deadline := time.Now().Add(d)
	n, err := unix.Poll(pfds, int(max(time.Until(deadline).Milliseconds(), 0)))
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(pfds, int(max(time.Until(deadline).Milliseconds(), 0)))
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pfds {
		if n > 0 && p.Revents != 0 {
			st, _ := v.procs[i].Wait()
			t.Fatalf("process %d of the process group %d that got the reaped pid died: %v", v.procs[i].Pid, v.PID, st)
		}
	}
}
