package handoff

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ShimArg is argv[1] of the re-exec shim: `deployd ShimArg -- app args...`.
// The shim sets LISTEN_PID to its own pid and execs the app, which keeps
// that pid: Go cannot set an environment variable between fork and exec.
const ShimArg = "__deployd-exec"

// Env names of the worker contract.
const (
	EnvListenFDs     = "LISTEN_FDS"
	EnvListenPID     = "LISTEN_PID"
	EnvListenFDNames = "LISTEN_FDNAMES"
	EnvNotifySocket  = "NOTIFY_SOCKET"
	EnvNodeChannelFD = "NODE_CHANNEL_FD"
)

// Proc describes a worker process to start.
type Proc struct {
	Shim string   // the deployd binary that runs the shim
	Argv []string // the app; Argv[0] absolute or relative to Dir
	Dir  string
	Env  []string // LISTEN_* (which Start sets) and TABLEFLIP_* are dropped
	// Stdout and Stderr are the write ends of the worker's output pipes.
	Stdout, Stderr *os.File
	Listeners      []Bound // become fds 3, 4, ...
	// Health, when set, is the worker's private health listener: the fd
	// after the listeners, counted in LISTEN_FDS and named HealthFDName.
	Health *os.File
	// Extra files follow the listeners and Health (e.g. the node-ipc
	// channel); their numbers are 3+len(Listeners)+i, plus 1 with Health.
	Extra []*os.File
	// Fixed files get exactly the fd number At (above the ones before:
	// the node integration's channel and listener copies at fd 50+).
	Fixed []FixedFile
	// Keep are the agent's ends that the worker holds for the next agent
	// should this one die (keep.go): fds KeepFD, KeepFD+1, ...
	Keep []*os.File
	// Trap, when set, is the shim's end of a bindtrap.Pair, passed at fd
	// TrapFD: the shim installs the bind trap, sends its notify fd on it,
	// and the worker keeps the notify fd at TrapFD (bindtrap.go). Ignored
	// with Direct, which has no shim.
	Trap       *os.File
	Credential *syscall.Credential
	// Pin pins the worker to CPU (the shim sets the affinity before it
	// execs the app).
	Pin bool
	CPU int
	// Direct starts Exec (the resolved Argv[0]) without the shim, for an
	// app that sets LISTEN_PID to its own pid itself before its code runs
	// (node with deployd's preload): one Go runtime start less per worker.
	// Ignored with Pin, which needs the shim.
	Direct bool
	Exec   string
	// Cgroup, when UseCgroup is set, is an open cgroup v2 folder the
	// process starts in (clone3 CLONE_INTO_CGROUP, Linux >= 5.7): the
	// worker and everything it starts stay there, daemons included.
	UseCgroup bool
	Cgroup    int
}

// Start forks the shim with the listeners as fds 3.. in a new process group.
// The worker outlives the agent (no Pdeathsig): a next agent adopts it after
// a handoff, or retires it after a crash (see the agent's survivor records).
// Listener flags are untouched.
func Start(p Proc) (*os.Process, error) {
	if len(p.Argv) == 0 {
		return nil, errors.New("handoff: empty command")
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()

	files := []uintptr{devnull.Fd(), p.Stdout.Fd(), p.Stderr.Fd()}
	names := make([]string, 0, len(p.Listeners))
	for _, l := range p.Listeners {
		fd, err := l.Fd()
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", p.Argv[0], err)
		}
		files = append(files, fd)
		names = append(names, l.Name)
	}
	nfds := len(p.Listeners)
	if p.Health != nil {
		fd, err := rawFd(p.Health)
		if err != nil {
			return nil, err
		}
		files = append(files, fd)
		names = append(names, HealthFDName)
		nfds++
	}
	for _, f := range p.Extra {
		fd, err := rawFd(f)
		if err != nil {
			return nil, err
		}
		files = append(files, fd)
	}
	fixed := p.Fixed
	if p.Trap != nil {
		fd, err := rawFd(p.Trap)
		if err != nil {
			return nil, err
		}
		fixed = append(fixed, FixedFile{At: TrapFD, Fd: fd})
	}
	for i, f := range p.Keep {
		fd, err := rawFd(f)
		if err != nil {
			return nil, err
		}
		fixed = append(fixed, FixedFile{At: KeepFD + i, Fd: fd})
	}
	if files, err = placeFixed(files, fixed); err != nil {
		return nil, err
	}
	env := append(without(p.Env, startVar),
		EnvListenFDs+"="+strconv.Itoa(nfds),
		EnvListenFDNames+"="+strings.Join(names, ":"))
	path, argv := p.Shim, []string{p.Shim, ShimArg}
	if p.Direct && !p.Pin && p.Trap == nil && p.Exec != "" {
		path, argv = p.Exec, p.Argv
	} else {
		if p.Pin {
			argv = append(argv, "--cpu", strconv.Itoa(p.CPU))
		}
		if p.Trap != nil {
			argv = append(argv, trapArg, strconv.Itoa(TrapFD))
		}
		argv = append(append(argv, "--"), p.Argv...)
	}
	attr := &syscall.ProcAttr{
		Dir:   p.Dir,
		Env:   env,
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setpgid:     true,
			Credential:  p.Credential,
			UseCgroupFD: p.UseCgroup,
			CgroupFD:    p.Cgroup,
		},
	}
	pid, err := syscall.ForkExec(path, argv, attr)
	runtime.KeepAlive(p.Listeners)
	runtime.KeepAlive(p.Extra)
	runtime.KeepAlive(p.Health)
	runtime.KeepAlive(p.Keep)
	runtime.KeepAlive(p.Trap)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Argv[0], err)
	}
	return os.FindProcess(pid)
}

// FixedFile is a file passed at a chosen fd number.
type FixedFile struct {
	At int
	Fd uintptr // kept open by the caller until Start returns
}

// placeFixed puts each fixed file at its number; the slots between are
// closed in the child (syscall.ProcAttr.Files: ^uintptr(0) closes a slot).
func placeFixed(files []uintptr, fixed []FixedFile) ([]uintptr, error) {
	for _, f := range fixed {
		if f.At < len(files) {
			return nil, fmt.Errorf("handoff: fd %d is taken (%d fds before it)", f.At, len(files))
		}
		for len(files) < f.At {
			files = append(files, ^uintptr(0))
		}
		files = append(files, f.Fd)
	}
	return files, nil
}

func rawFd(f *os.File) (uintptr, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("fd of %s: %w", f.Name(), err)
	}
	var out uintptr
	if err := raw.Control(func(fd uintptr) { out = fd }); err != nil {
		return 0, fmt.Errorf("fd of %s: %w", f.Name(), err)
	}
	return out, nil
}

// RunShim is the shim's main: args are what follows ShimArg. It only returns
// on failure, with the exit code to use (127: not found, 126: not executable).
func RunShim(args []string) int {
	// The CPU affinity set below belongs to this thread: exec from it.
	runtime.LockOSThread()
	if len(args) > 1 && args[0] == "--cpu" {
		cpu, err := strconv.Atoi(args[1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "deployd exec: --cpu %q: %v\n", args[1], err)
			return 2
		}
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			fmt.Fprintf(os.Stderr, "deployd exec: pin to CPU %d: %v\n", cpu, err)
			return 126
		}
		args = args[2:]
	}
	if len(args) > 1 && args[0] == trapArg {
		if code := shimTrap(args[1]); code != 0 {
			return code
		}
		args = args[2:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "deployd exec: no command")
		return 2
	}
	path := args[0]
	if !strings.Contains(path, "/") {
		lp, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "deployd exec: %s: not found in PATH\n", path)
			return 127
		}
		path = lp
	}
	env := os.Environ()
	if os.Getenv(EnvListenFDs) != "" {
		env = append(env, EnvListenPID+"="+strconv.Itoa(os.Getpid()))
	}
	err := syscall.Exec(path, args, env)
	fmt.Fprintf(os.Stderr, "deployd exec: %s: %v\n", path, err)
	if errors.Is(err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// ExecPath resolves argv0 as the shim does (exec.LookPath in the worker's
// environment and folder), for a Direct start: a name with a slash as it
// is, else the first executable file in the first PATH of env. ok is false
// when it cannot tell (not found, not executable, a relative PATH entry
// before a match): the shim then starts the app and says what is wrong.
func ExecPath(argv0 string, env []string, dir string) (path string, ok bool) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		return argv0, executable(p)
	}
	var pathVar string
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, "PATH="); found {
			pathVar = v
			break
		}
	}
	for _, d := range filepath.SplitList(pathVar) {
		if !filepath.IsAbs(d) {
			return "", false // exec.LookPath refuses what it finds there (ErrDot)
		}
		if p := filepath.Join(d, argv0); executable(p) {
			return p, true
		}
	}
	return "", false
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
