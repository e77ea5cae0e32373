package procunit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxProcs bounds the entries of /proc that one sweep reads.
const maxProcs = 1 << 17

// sweep lists the live processes of a unit without a cgroup: in its
// process group, or with its marker in their environment (read from
// /proc/PID/environ: root reads every process's). The caller itself never
// counts.
func (u *Unit) sweep() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(maxProcs)
	d.Close()
	marker := []byte(MarkerVar + "=" + u.id)
	self := os.Getpid()
	var pids []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		if u.member(pid, marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// member reports whether live process pid belongs to the unit.
func (u *Unit) member(pid int, marker []byte) bool {
	// getpgid and the environment first: /proc/PID/stat is the costly read
	// (tens of µs for a process with many threads), so it is read only for
	// the few processes that may be members.
	pg, err := unix.Getpgid(pid)
	if err != nil {
		return false
	}
	// The group id is the command's pid: it names the unit's group only
	// while the command holds that pid (runs, or exited and not reaped).
	// Once it was reaped, the pid is free, and a process group of that id
	// may be anyone's (a root shell's job): only the marker counts then.
	// Asked after getpgid, so that a group read before is the unit's.
	inGroup := pg == u.pgid && u.leaderHolds()
	if !inGroup {
		if u.id == "" {
			return false // a record without a marker (Reopen): its group alone
		}
		env, err := readEnvironWithin(pid, environTimeout)
		if err != nil || !slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool {
			return bytes.Equal(kv, marker)
		}) {
			return false
		}
	}
	stat, err := readBounded("/proc/"+strconv.Itoa(pid)+"/stat", 4096)
	if err != nil {
		return false
	}
	// PID (COMM) STATE PPID PGRP ...: the name may hold spaces and ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 3 || string(f[0]) == "Z" || string(f[0]) == "X" {
		return false
	}
	// Field 22, the start time: a process older than the unit's command
	// is not one of its own, whatever its environment or group says (a
	// group id reused after the unit's group emptied, after a reboot).
	if len(f) > 19 {
		if start, err := strconv.ParseUint(string(f[19]), 10, 64); err == nil && start < u.since {
			return false
		}
	}
	return true
}

// killSweep SIGKILLs the unit's processes through pidfds (checked again
// once open, so that a reused pid is never hit), sweeping again until a
// sweep finds none: a process forked during one sweep is found by the
// next. It waits for each to exit, at most until ctx ends.
func (u *Unit) killSweep(ctx context.Context) error {
	for {
		pids := u.sweep()
		if len(pids) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("procunit: processes still alive: %v", pids)
		}
		var fds []int
		for _, pid := range pids {
			fd, err := u.openMember(pid)
			if errors.Is(err, errNoPidfd) {
				waitExits(ctx, fds)
				return fmt.Errorf("processes %v left alive: %w", pids, err)
			}
			if err != nil {
				continue // gone, or its pid is not the unit's any more
			}
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			fds = append(fds, fd)
		}
		waitExits(ctx, fds)
	}
}

// waitExits waits until every pidfd polls readable (its process exited),
// at most until ctx ends or a second passed, and closes them.
func waitExits(ctx context.Context, fds []int) {
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	deadline := time.Now().Add(time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	pending := make([]unix.PollFd, 0, len(fds))
	for _, fd := range fds {
		pending = append(pending, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	for len(pending) > 0 {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return
		}
		n, err := unix.Poll(pending, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n <= 0 {
			continue
		}
		left := pending[:0]
		for _, p := range pending {
			if p.Revents == 0 {
				p.Revents = 0
				left = append(left, p)
			}
		}
		pending = left
	}
}

// leaderHolds reports whether the unit's command still holds its pid (it
// runs, or exited and was not reaped): a signal 0 through its pidfd
// reaches a zombie too, and fails (ESRCH) once it was reaped. A kernel
// fact, where a start time tells apart only processes started in
// different clock ticks.
func (u *Unit) leaderHolds() bool {
	if u.leader == nil {
		return false
	}
	raw, err := u.leader.SyscallConn()
	if err != nil {
		return false // closed
	}
	held := false
	_ = raw.Control(func(fd uintptr) { held = unix.PidfdSendSignal(int(fd), 0, nil, 0) == nil })
	return held
}

// startTime is field 22 of /proc/PID/stat (clock ticks after boot), 0
// when it cannot be read.
func startTime(pid int) uint64 {
	stat, err := readBounded("/proc/"+strconv.Itoa(pid)+"/stat", 4096)
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) <= 19 {
		return 0
	}
	n, _ := strconv.ParseUint(string(f[19]), 10, 64)
	return n
}

// exited reports whether pid is gone or a zombie.
func exited(pid int) bool {
	stat, err := readBounded("/proc/"+strconv.Itoa(pid)+"/stat", 4096)
	i := bytes.LastIndexByte(stat, ')')
	if err != nil || i < 0 || i+2 >= len(stat) {
		return true
	}
	return stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// maxEnviron bounds the read of a process's environment.
const maxEnviron = 1 << 20

// environTimeout bounds the wait for one process's environment: the
// kernel reads it from the process's memory under its mmap lock, which a
// process stuck in the kernel (a page fault on a hung NFS mount) can hold
// for as long as it is stuck. Such a process is not counted as the unit's
// (a member stuck so is also past a kill until it wakes).
const environTimeout = time.Second

// envReads are the environment reads in flight, by pid. Sweeps run at
// once (two workers ending together, a stop beside an exit sweep) and
// each reads every process's environment: a second reader of a pid joins
// the read in flight and gets its answer, and is never told that the
// process is not a member because another sweep is reading it. A read
// that has not returned within the bound (a stuck process) is given up by
// every reader, and later sweeps skip the process while it hangs rather
// than start another read that would hang too, so that a stuck process
// costs one goroutine, not one per sweep.
var (
	envMu    sync.Mutex
	envReads = map[int]*envRead{}
)

// envRead is one read of a process's environment; done is closed once
// env and err are set.
type envRead struct {
	start   time.Time
	done    chan struct{}
	env     []byte
	err     error
	readers int // callers waiting on it (for tests)
}

// readEnv reads a process's environment (readEnviron; a test's stand-in).
var readEnv = readEnviron

// readEnvironWithin is readEnv, given up d after the read of pid began:
// a caller joins a read in flight rather than start another.
func readEnvironWithin(pid int, d time.Duration) ([]byte, error) {
	envMu.Lock()
	r, ok := envReads[pid]
	if !ok {
		r = &envRead{start: time.Now(), done: make(chan struct{})}
		envReads[pid] = r
		go func() {
			env, err := readEnv(pid)
			envMu.Lock()
			r.env, r.err = env, err
			delete(envReads, pid)
			envMu.Unlock()
			close(r.done)
		}()
	}
	r.readers++
	envMu.Unlock()
	defer func() {
		envMu.Lock()
		r.readers--
		envMu.Unlock()
	}()
	if ok && time.Since(r.start) >= d {
		select {
		case <-r.done:
			return r.env, r.err
		default:
			return nil, fmt.Errorf("procunit: the environment of %d: an earlier read still hangs", pid)
		}
	}
	t := time.NewTimer(d - time.Since(r.start))
	defer t.Stop()
	select {
	case <-r.done:
		return r.env, r.err
	case <-t.C:
		return nil, fmt.Errorf("procunit: the environment of %d: no answer in %v", pid, d)
	}
}

// readEnviron reads pid's environment, at most maxEnviron bytes, into a
// buffer that grows with it: most are a few KiB, and a sweep reads many.
func readEnviron(pid int) ([]byte, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxEnviron))
}
