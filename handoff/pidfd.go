package handoff

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotSameProcess means a pid no longer names the process that was
// recorded: it exited, or its pid was reused (the start time differs).
var ErrNotSameProcess = errors.New("handoff: not the recorded process")

// StartTime is a process's start time in clock ticks since boot
// (/proc/PID/stat field 22). With the pid it names one process: a reused pid
// has a later start time.
func StartTime(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}

// Running reports whether the process that started at start still runs
// as pid (not exited, not a zombie).
func Running(pid int, start uint64) bool {
	st, state, err := procStat(pid)
	return err == nil && st == start && state != "Z" && state != "X"
}

// procStat reads the start time and the state of pid.
func procStat(pid int) (uint64, string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", err
	}
	// The command name (field 2) may hold spaces and ')': fields after the
	// last ')' are plain. Field 3 (state) is the first of them.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	st, err := strconv.ParseUint(f[19], 10, 64) // field 22
	return st, f[0], err
}

// Pidfd watches and signals a process that need not be the caller's child
// (pidfd_open, Linux >= 5.3): a process an agent adopted from the previous
// one. The fd is in Go's poller, so waiting takes no thread.
type Pidfd struct {
	pid int
	f   *os.File
}

// OpenPidfd opens a pidfd for pid and checks that it is the process that
// started at start (StartTime); otherwise it returns ErrNotSameProcess.
// The start time is read after the pidfd is open, so a pid reused in between
// is caught: the pidfd then names the new process, whose start differs.
func OpenPidfd(pid int, start uint64) (*Pidfd, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("pid %d: %w (it has exited)", pid, ErrNotSameProcess)
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	p := &Pidfd{pid: pid, f: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))}
	got, err := StartTime(pid)
	if err != nil || got != start {
		p.Close()
		return nil, fmt.Errorf("pid %d: start time %d, recorded %d: %w", pid, got, start, ErrNotSameProcess)
	}
	// A zombie still has its /proc entry: not worth adopting either.
	if p.exited() {
		p.Close()
		return nil, fmt.Errorf("pid %d: %w (it has exited)", pid, ErrNotSameProcess)
	}
	return p, nil
}

// exited polls the pidfd without blocking.
func (p *Pidfd) exited() bool {
	fd, err := rawFd(p.f)
	if err != nil {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// Wait blocks until the process has exited (the pidfd polls readable). Its
// exit status is not the caller's to read unless it is its child.
func (p *Pidfd) Wait() error {
	raw, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err != nil || n > 0
	})
}

// WaitChild waits for p, a child of the caller, to exit and reaps it, with
// p.Wait's *os.ProcessState (exit status, rusage). The wait is a pidfd in
// Go's poller: no OS thread is blocked in waitid while the worker runs (one
// per worker otherwise). p.Wait then finds a zombie and returns at once.
// Without pidfds (Linux < 5.3, a seccomp filter) a thread waits instead.
func WaitChild(p *os.Process) (*os.ProcessState, error) {
	_ = AwaitExit(p) // on an error, p.Wait below blocks instead
	return p.Wait()
}

// AwaitExit waits until p, a child of the caller, has exited, and leaves
// it unreaped (a zombie) for the caller's p.Wait: until then its pid, and
// the process group of that id, cannot be anyone else's, so what needs the
// pid (its group's members, its unit's sweep) is done in between. The wait
// is a pidfd in Go's poller; without pidfds, waitid with WNOWAIT (an OS
// thread blocked while the child runs).
func AwaitExit(p *os.Process) error {
	if fd, err := unix.PidfdOpen(p.Pid, unix.PIDFD_NONBLOCK); err == nil {
		pf := &Pidfd{pid: p.Pid, f: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(p.Pid))}
		err := pf.Wait()
		pf.Close()
		if err == nil {
			return nil
		}
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				return fmt.Errorf("wait for pid %d: %w", p.Pid, err)
			}
			return nil
		}
	}
}

// Signal sends sig to the process itself (never to a reused pid).
func (p *Pidfd) Signal(sig syscall.Signal) error {
	raw, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), sig, nil, 0)
	}); err != nil {
		return err
	}
	return serr
}

// Close closes the pidfd. Safe to call twice.
func (p *Pidfd) Close() error {
	err := p.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// Listeners copies every listening socket the process holds (pidfd_getfd,
// Linux >= 5.6; needs ptrace rights over it: the same user, or
// CAP_SYS_PTRACE), found through /proc/PID/fd whatever their fd numbers
// (apps move them: go-systemd's activation dups fd 3 and closes it). The
// registry adopts them as it adopts sockets from systemd: how an agent takes
// the sockets back from the workers that a killed agent left serving.
func (p *Pidfd) Listeners() ([]*Activated, error) {
	dir := "/proc/" + strconv.Itoa(p.pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	raw, err := p.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []*Activated
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:") || seen[link] {
			continue
		}
		seen[link] = true
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		nfd, gerr := -1, error(nil)
		if err := raw.Control(func(pfd uintptr) { nfd, gerr = unix.PidfdGetfd(int(pfd), n, 0) }); err != nil {
			return out, err
		}
		if gerr != nil {
			return out, fmt.Errorf("pidfd_getfd pid %d fd %d: %w", p.pid, n, gerr)
		}
		s, err := inspect(nfd, "unknown")
		if err != nil {
			unix.Close(nfd) // not a listening stream socket
			continue
		}
		out = append(out, s)
	}
	return out, nil
}
