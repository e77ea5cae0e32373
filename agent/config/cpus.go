package config

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuSource is where UsableCPUs looks, behind funcs so tests can fake a
// cgroup tree.
type cpuSource struct {
	affinity   func() (int, error)
	readFile   func(string) ([]byte, error)
	cgroupRoot string // the cgroup v2 mount
}

var hostCPUs = cpuSource{
	affinity: func() (int, error) {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			return 0, err
		}
		return set.Count(), nil
	},
	readFile:   os.ReadFile,
	cgroupRoot: "/sys/fs/cgroup",
}

// UsableCPUs is how many CPUs this process may use: the CPUs in its
// affinity mask, capped by the cgroup v2 cpu.max quota of its cgroup and
// every parent (ceil(quota/period)); at least 1. It is what
// `instances = "max"` means. Safe to call concurrently.
func UsableCPUs() int { return hostCPUs.count() }

func (s cpuSource) count() int {
	n, err := s.affinity()
	if err != nil || n < 1 {
		n = runtime.NumCPU()
	}
	if q, ok := s.quota(); ok {
		n = min(n, q)
	}
	return max(n, 1)
}

// quota returns the smallest cpu.max limit, in whole CPUs, from the
// process's cgroup up to the root; false when there is none.
func (s cpuSource) quota() (int, bool) {
	cg, ok := s.cgroupPath()
	if !ok {
		return 0, false
	}
	root := filepath.Clean(s.cgroupRoot)
	limit, found := 0, false
	for dir := filepath.Join(root, cg); ; dir = filepath.Dir(dir) {
		if q, ok := s.cpuMax(filepath.Join(dir, "cpu.max")); ok && (!found || q < limit) {
			limit, found = q, true
		}
		if dir == root || !strings.HasPrefix(dir, root) {
			break
		}
	}
	return limit, found
}

// cgroupPath returns the v2 ("0::") path of this process's cgroup.
func (s cpuSource) cgroupPath() (string, bool) {
	data, err := s.readFile("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if path, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return path, true
		}
	}
	return "", false
}

// cpuMax parses a cpu.max file ("max 100000" or "150000 100000").
func (s cpuSource) cpuMax(path string) (int, bool) {
	data, err := s.readFile(path)
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 || fields[0] == "max" {
		return 0, false
	}
	quota, err1 := strconv.ParseInt(fields[0], 10, 64)
	period, err2 := strconv.ParseInt(fields[1], 10, 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0, false
	}
	return int(max((quota+period-1)/period, 1)), true
}
