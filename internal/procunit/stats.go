package procunit

import (
	"bytes"
	"path/filepath"
	"strconv"
)

// Stats are what the kernel counted for a unit's cgroups: its memory and
// what its limits did. Zero where the unit has no such cgroup.
type Stats struct {
	MemoryBytes  int64  // memory.current (v2), memory.usage_in_bytes (v1)
	MemoryHigh   uint64 // times over memory_high (memory.events high, v2)
	OOMKills     uint64 // processes the OOM killer killed (oom_kill)
	ForksRefused uint64 // forks refused at pids_max (pids.events max)
	Throttled    uint64 // periods throttled by cpu_max (cpu.stat nr_throttled)
}

// Stats reads the unit's cgroup counters.
func (u *Unit) Stats() Stats {
	var st Stats
	if u.cg != nil {
		d := u.cg.dir
		st.MemoryBytes = int64(readNumber(filepath.Join(d, "memory.current")))
		st.MemoryHigh = readKey(filepath.Join(d, "memory.events"), "high")
		st.OOMKills = readKey(filepath.Join(d, "memory.events"), "oom_kill")
		st.ForksRefused = readKey(filepath.Join(d, "pids.events"), "max")
		st.Throttled = readKey(filepath.Join(d, "cpu.stat"), "nr_throttled")
	}
	if d, ok := u.v1["memory"]; ok {
		st.MemoryBytes = int64(readNumber(filepath.Join(d, "memory.usage_in_bytes")))
		st.OOMKills = readKey(filepath.Join(d, "memory.oom_control"), "oom_kill")
	}
	if d, ok := u.v1["pids"]; ok {
		st.ForksRefused = readKey(filepath.Join(d, "pids.events"), "max")
	}
	if d, ok := u.v1["cpu"]; ok {
		st.Throttled = readKey(filepath.Join(d, "cpu.stat"), "nr_throttled")
	}
	return st
}

// readNumber reads a file holding one number; 0 when it cannot.
func readNumber(path string) uint64 {
	b, err := readBounded(path, 64)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	return n
}

// readKey reads the value of key in a flat-keyed file ("KEY VALUE" lines).
func readKey(path, key string) uint64 {
	b, err := readBounded(path, 4096)
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) == 2 && string(f[0]) == key {
			n, _ := strconv.ParseUint(string(f[1]), 10, 64)
			return n
		}
	}
	return 0
}
