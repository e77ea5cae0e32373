// Package procstat reads what deployd needs of /proc/PID/stat: CPU time,
// resident memory, threads and start time. It replaces a general /proc
// library whose size the agent paid for in resident memory (BENCHMARKS.md,
// "Agent memory").
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture deployd builds for).
const userHZ = 100

// FS reads the proc file system mounted at Root ("" means /proc).
type FS struct{ Root string }

func (fs FS) path(elem ...string) string {
	root := fs.Root
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

// Stat is the part of /proc/PID/stat deployd reads.
type Stat struct {
	UTime, STime uint64 // CPU time in user and kernel mode, in clock ticks
	NumThreads   int64
	StartTicks   uint64 // start time after boot, in clock ticks
	VSize        uint64 // virtual memory size in bytes
	RSSPages     int64  // resident set size in pages
}

// CPUSeconds is the user plus system CPU time.
func (s Stat) CPUSeconds() float64 { return float64(s.UTime+s.STime) / userHZ }

// RSSBytes is the resident set size in bytes.
func (s Stat) RSSBytes() int64 { return s.RSSPages * int64(os.Getpagesize()) }

// StartSeconds is the start time in seconds after boot.
func (s Stat) StartSeconds() float64 { return float64(s.StartTicks) / userHZ }

// Stat reads /proc/PID/stat; pid 0 means the calling process.
func (fs FS) Stat(pid int) (Stat, error) {
	name := "self"
	if pid != 0 {
		name = strconv.Itoa(pid)
	}
	b, err := os.ReadFile(fs.path(name, "stat"))
	if err != nil {
		return Stat{}, fmt.Errorf("procstat: %w", err)
	}
	return parseStat(b)
}

// parseStat parses the contents of /proc/PID/stat. The command name (field
// 2) is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted from the last ')'.
func parseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("procstat: stat: no command name")
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	const last = 24            // rss
	if len(f) < last-2 {
		return Stat{}, fmt.Errorf("procstat: stat: %d fields, want at least %d", len(f)+2, last)
	}
	field := func(n int) []byte { return f[n-3] }
	var s Stat
	var errs []error
	u := func(n int) uint64 {
		v, err := strconv.ParseUint(string(field(n)), 10, 64)
		errs = append(errs, err)
		return v
	}
	d := func(n int) int64 {
		v, err := strconv.ParseInt(string(field(n)), 10, 64)
		errs = append(errs, err)
		return v
	}
	s.UTime, s.STime, s.NumThreads = u(14), u(15), d(20)
	s.StartTicks, s.VSize, s.RSSPages = u(22), u(23), d(24)
	if err := errors.Join(errs...); err != nil {
		return Stat{}, fmt.Errorf("procstat: stat: %w", err)
	}
	return s, nil
}

// BootTime is when the system booted, in seconds since the epoch (btime in
// /proc/stat).
func (fs FS) BootTime() (int64, error) {
	b, err := os.ReadFile(fs.path("stat"))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			t, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("procstat: btime: %w", err)
			}
			return t, nil
		}
	}
	return 0, errors.New("procstat: no btime in stat")
}

// OpenFDs counts the open file descriptors of the calling process.
func (fs FS) OpenFDs() (int, error) {
	ents, err := os.ReadDir(fs.path("self", "fd"))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return len(ents), nil
}
