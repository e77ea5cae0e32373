package procunit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup is a unit's cgroup v2 folder.
type cgroup struct {
	dir string
	fd  int // the folder, open for clone3 until the command started; -1 after
}

// newCgroup makes the folder name in the agent's own cgroup v2, nil when
// it cannot: no cgroup v2 hierarchy mounted (cgroup v1 alone), the agent's
// cgroup not under the mount (another cgroup namespace), no right to make
// a folder there (an unprivileged agent in a session scope).
func newCgroup(name string) *cgroup {
	base := ownCgroupDir()
	if base == "" {
		return nil
	}
	dir := filepath.Join(base, "deployd-"+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(dir)
		return nil
	}
	return &cgroup{dir: dir, fd: fd}
}

// ownCgroupDir is the folder of the calling process's cgroup v2, "" when
// there is none.
func ownCgroupDir() string { return cgroupDir("self") }

// cgroupDir is the folder of process pid's cgroup v2 ("self": the
// caller's), "" when there is none: its "0::PATH" line of
// /proc/PID/cgroup under the first cgroup2 mount (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid system) whose root is a prefix of
// PATH.
func cgroupDir(pid string) string {
	b, err := readBounded("/proc/"+pid+"/cgroup", 64<<10)
	if err != nil {
		return ""
	}
	var own string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = p
		}
	}
	if !strings.HasPrefix(own, "/") || strings.HasSuffix(own, " (deleted)") {
		return ""
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		root, mnt := fields[3], fields[4]
		rel, ok := strings.CutPrefix(own, root)
		if !ok || root != "/" && rel != "" && !strings.HasPrefix(rel, "/") {
			continue
		}
		dir := filepath.Join(mnt, rel)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			return dir
		}
	}
	return ""
}

func (c *cgroup) closeFD() {
	if c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

// procs lists the pids in the cgroup.
func (c *cgroup) procs() []int {
	b, err := readBounded(filepath.Join(c.dir, "cgroup.procs"), 1<<20)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// populated reads cgroup.events.
func (c *cgroup) populated() (bool, error) {
	b, err := readBounded(filepath.Join(c.dir, "cgroup.events"), 4096)
	if err != nil {
		return false, err
	}
	return bytes.Contains(b, []byte("populated 1")), nil
}

// kill kills every process in the cgroup (cgroup.kill, Linux >= 5.14;
// else SIGKILL to each until none is left) and waits until it is empty.
func (c *cgroup) kill(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		c.killEach()
	}
	// cgroup.events changes (poll: POLLPRI) when the last process leaves;
	// each wait is short as well, so that an older kernel's SIGKILL loop
	// above gets another round.
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		pop, err := c.populated()
		if err != nil {
			return fmt.Errorf("procunit: %w", err)
		}
		if !pop {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("procunit: processes of %s still alive: %v", c.dir, c.procs())
		}
		c.waitEvents(wait)
		c.killEach()
	}
}

// killEach SIGKILLs each process cgroup.procs lists through a pidfd, if
// it is still in the cgroup once the pidfd is open: a listed process may
// exit and its pid be reused before the signal (a kernel without
// cgroup.kill; one with it never gets here while the cgroup exists).
func (c *cgroup) killEach() {
	for _, pid := range c.procs() {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone (a unit with a cgroup means Linux >= 5.7: pidfds exist)
		}
		if cgroupDir(strconv.Itoa(pid)) == c.dir {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
}

// waitEvents waits at most d for cgroup.events to change.
func (c *cgroup) waitEvents(d time.Duration) {
	fd, err := unix.Open(filepath.Join(c.dir, "cgroup.events"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		time.Sleep(d)
		return
	}
	defer unix.Close(fd)
	var buf [256]byte
	_, _ = unix.Read(fd, buf[:]) // kernfs notifies a reader of a change after its read
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}, int(d.Milliseconds())+1)
}

// removeGrace bounds how long removeWhenEmpty waits for the last zombies.
const removeGrace = time.Second

// removeWhenEmpty removes the cgroup folder once it is empty: a process
// that exited stays in it until it is reaped, and the orphans of a unit's
// command are reaped by init (or a subreaper), not by the agent. It waits
// for that at most removeGrace (or until ctx ends).
func (c *cgroup) removeWhenEmpty(ctx context.Context) error {
	deadline := time.Now().Add(removeGrace)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := c.remove()
		if err == nil || !errors.Is(err, unix.EBUSY) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		c.waitEvents(wait)
	}
}

// remove removes the cgroup folder (empty by then). Safe to call twice.
func (c *cgroup) remove() error {
	c.closeFD()
	err := os.Remove(c.dir)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("procunit: remove cgroup: %w", err)
}
