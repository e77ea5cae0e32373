// Package procstat reads what deployd needs of /proc/PID/stat: CPU time,
// resident memory, threads and start time. It replaces a general /proc
// library whose size the agent paid for in resident memory (BENCHMARKS.md,
// "Agent memory").
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
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

// statMax bounds what Stat reads of /proc/PID/stat: the 52 fields of
// Linux 6 take at most ~1 000 bytes (a 16-byte command name, numbers of up
// to 20 digits), usually ~300.
const statMax = 2048

// Stat reads /proc/PID/stat; pid 0 means the calling process. The agent
// samples every worker once a second, so Stat allocates only its path and
// the open file: an idle agent that produced garbage every second grew its
// heap to the GC's goal (4 MiB) between collections (BENCHMARKS.md, "Agent
// memory").
func (fs FS) Stat(pid int) (Stat, error) {
	var buf [statMax]byte
	path := fs.statPath(buf[:0], pid)
	// Plain syscalls: through *os.File (its poller's function values) or
	// an io.Reader, buf would escape to the heap.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stat{}, fmt.Errorf("procstat: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return Stat{}, fmt.Errorf("procstat: read %s: %w", path, err)
		}
		if m == 0 {
			return parseStat(buf[:n])
		}
		n += m
	}
	return Stat{}, fmt.Errorf("procstat: %s: longer than %d bytes", path, statMax)
}

// statPath is Root/PID/stat (Root/self/stat for pid 0), built in b.
func (fs FS) statPath(b []byte, pid int) string {
	if fs.Root == "" {
		b = append(b, "/proc"...)
	} else {
		b = append(b, fs.Root...)
	}
	b = append(b, '/')
	if pid == 0 {
		b = append(b, "self"...)
	} else {
		b = strconv.AppendInt(b, int64(pid), 10)
	}
	return string(append(b, "/stat"...))
}

// parseStat parses the contents of /proc/PID/stat. The command name (field
// 2) is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted from the last ')'.
func parseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("procstat: stat: no command name")
	}
	const last = 24        // rss
	var f [last + 1][]byte // f[n] is field n, for n ≥ 3 (the state)
	rest := b[i+1:]
	for n := 3; n <= last; n++ {
		rest = bytes.TrimLeft(rest, " \n")
		if len(rest) == 0 {
			return Stat{}, fmt.Errorf("procstat: stat: %d fields, want at least %d", n-1, last)
		}
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		f[n], rest = rest[:end], rest[end:]
	}
	bad := 0 // the first field that is not a number
	u := func(n int) uint64 {
		v, ok := parseUint(f[n])
		if !ok && bad == 0 {
			bad = n
		}
		return v
	}
	d := func(n int) int64 {
		v, ok := parseInt(f[n])
		if !ok && bad == 0 {
			bad = n
		}
		return v
	}
	var s Stat
	s.UTime, s.STime, s.NumThreads = u(14), u(15), d(20)
	s.StartTicks, s.VSize, s.RSSPages = u(22), u(23), d(24)
	if bad != 0 {
		return Stat{}, fmt.Errorf("procstat: stat: field %d: %q is not a number", bad, string(f[bad]))
	}
	return s, nil
}

// parseUint parses a decimal number without allocating (strconv's error
// would hold a copy of the input).
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// parseInt is parseUint with an optional minus sign.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	v, ok := parseUint(b)
	if !ok || v > math.MaxInt64 {
		return 0, false
	}
	if neg {
		return -int64(v), true
	}
	return int64(v), true
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
