package handoff

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A worker outlives its agent, and so must what connects the two: the read
// ends of its output pipes, its notify socket and its node-ipc channel. The
// agent holds them, and a SIGKILL closes the agent's copies; so every worker
// also holds a copy of each (Proc.Keep), at fd KeepFD and up, which it never
// uses. While no agent runs, its output waits in its pipes (PipeSize bytes
// each: a worker that writes more blocks until the next agent reads; it
// never gets EPIPE) and its notify datagrams in its notify socket. The next
// agent copies them out of the worker (Pidfd.GetFd, as it copies the
// listeners) and reads on from where the dead agent stopped. The worker also
// keeps its output journals (workers/logs.Journal), which hold what the dead
// agent had taken out of the pipes but may not have written.

// KeepFD is the fd number of a worker's first kept file: above the ones the
// worker contract uses (listeners from 3, the Node.js preload's from 50).
const KeepFD = 200

// PipeSize is the size each output pipe of a worker is raised to
// (F_SETPIPE_SZ): what a worker can write while no agent reads it. It is
// the default of fs.pipe-max-size, the most an unprivileged process gets.
const PipeSize = 1 << 20

// EnlargePipe raises f's pipe buffer to PipeSize (or the most the system
// allows, fs.pipe-max-size) and returns the size it has.
func EnlargePipe(f *os.File) (int, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var size int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		size, serr = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, PipeSize)
		if serr != nil { // above fs.pipe-max-size without CAP_SYS_RESOURCE
			if b, err := os.ReadFile("/proc/sys/fs/pipe-max-size"); err == nil {
				if max, err := strconv.Atoi(string(b[:len(b)-1])); err == nil && max > 0 {
					size, serr = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, max)
				}
			}
		}
		if serr != nil {
			size, _ = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0)
		}
	}); err != nil {
		return 0, err
	}
	return size, serr
}

// GetFd copies fd n of the process (pidfd_getfd, Linux >= 5.6; ptrace rights
// over it). The copy is close-on-exec; its file description (offset, flags,
// the pipe or socket) is the process's.
func (p *Pidfd) GetFd(n int, name string) (*os.File, error) {
	raw, err := p.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd, gerr := -1, error(nil)
	if err := raw.Control(func(pfd uintptr) { nfd, gerr = unix.PidfdGetfd(int(pfd), n, 0) }); err != nil {
		return nil, err
	}
	if gerr != nil {
		return nil, fmt.Errorf("pidfd_getfd pid %d fd %d: %w", p.pid, n, gerr)
	}
	return os.NewFile(uintptr(nfd), name), nil
}

// IsPipeReadEnd reports whether f is the read end of a pipe.
func IsPipeReadEnd(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return false
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return false
	}
	fl := -1
	_ = raw.Control(func(fd uintptr) { fl, _ = unix.FcntlInt(fd, unix.F_GETFL, 0) })
	return fl >= 0 && fl&unix.O_ACCMODE == unix.O_RDONLY
}
