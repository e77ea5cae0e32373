package sockdiag

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
)

// MaxFDs bounds how many descriptors Inodes reads of one process.
const MaxFDs = 1 << 16

// Inodes returns the inodes of the sockets pid holds, from /proc/PID/fd,
// reading MaxFDs descriptors at most. An error wrapping os.ErrPermission
// means the process is another user's and the caller may not look; one
// wrapping os.ErrNotExist, that it is gone.
func Inodes(pid int) (map[uint64]bool, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[uint64]bool{}
	for seen := 0; seen < MaxFDs; {
		names, err := f.Readdirnames(min(1024, MaxFDs-seen))
		seen += len(names)
		for _, n := range names {
			link, err := os.Readlink(dir + n)
			ino, ok := strings.CutPrefix(link, "socket:[")
			if err != nil || !ok {
				continue // closed since, or not a socket
			}
			if v, err := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 64); err == nil {
				out[v] = true
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Holder names a process that holds one of the sockets inodes, as
// "comm (pid N)", or "" when none is found (other users' processes are
// visible only to root).
func Holder(inodes map[uint64]bool) string {
	if len(inodes) == 0 {
		return ""
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return ""
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		held, _ := Inodes(pid)
		for ino := range held {
			if inodes[ino] {
				comm, _ := os.ReadFile("/proc/" + p.Name() + "/comm")
				return strings.TrimSpace(string(comm)) + " (pid " + p.Name() + ")"
			}
		}
	}
	return ""
}
