package procunit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Limits are a unit's resource limits (systemd's MemoryHigh=, MemoryMax=,
// CPUWeight=, CPUQuota=, TasksMax=, IOWeight=); a zero field is unset.
type Limits struct {
	MemoryHigh int64 // bytes: reclaim pressure above it (cgroup v2 alone)
	MemoryMax  int64 // bytes: the kernel's OOM killer above it
	CPUWeight  int   // 1..10000, 100 is the kernel's default
	CPUMax     int   // percent of one CPU per period (150: one and a half CPUs)
	PidsMax    int   // processes and threads
	IOWeight   int   // 1..10000 (cgroup v2 alone)
}

// cpuPeriod is the period of cpu_max's quota: systemd's default, 100 ms.
const cpuPeriod = 100 * time.Millisecond

// Key is a limit's config key and the controller it needs.
type Key struct {
	Name       string // "memory_max"
	Controller string // "memory"
	set        func(Limits) bool
}

// Keys are the limits, in config order.
var Keys = []Key{
	{"memory_high", "memory", func(l Limits) bool { return l.MemoryHigh > 0 }},
	{"memory_max", "memory", func(l Limits) bool { return l.MemoryMax > 0 }},
	{"cpu_weight", "cpu", func(l Limits) bool { return l.CPUWeight > 0 }},
	{"cpu_max", "cpu", func(l Limits) bool { return l.CPUMax > 0 }},
	{"pids_max", "pids", func(l Limits) bool { return l.PidsMax > 0 }},
	{"io_weight", "io", func(l Limits) bool { return l.IOWeight > 0 }},
}

// Unapplied is a limit that cannot apply on this host, and why.
type Unapplied struct {
	Key string
	Why string
}

// Check says which of l's limits cannot apply for an agent running as
// this process, and why (nothing when all can). It creates nothing.
func Check(l Limits) []Unapplied {
	var out []Unapplied
	for _, k := range Keys {
		if !k.set(l) {
			continue
		}
		if why := support(k); why != "" {
			out = append(out, Unapplied{k.Name, why})
		}
	}
	return out
}

// support is "" when key k can apply, else why not.
func support(k Key) string {
	if os.Getenv(EnvNoCgroup) == "1" || noCgroup {
		return "units do not use cgroups (" + EnvNoCgroup + "=1)"
	}
	if dir := ownCgroupDir(); dir != "" && hasController(dir, k.Controller) {
		return ""
	}
	v2only := k.Name == "memory_high" || k.Name == "io_weight"
	if !v2only {
		dir, err := v1Dir(k.Controller)
		if err == nil {
			if err = writable(dir); err == nil {
				return ""
			}
		}
		return fmt.Sprintf("the %s controller is not in the agent's cgroup v2 (its cgroup.controllers), and its cgroup v1 "+
			"hierarchy cannot be used: %v; run the agent as root, or give its service Delegate=yes on a host with the "+
			"unified hierarchy (systemd.unified_cgroup_hierarchy=1)", k.Controller, err)
	}
	return fmt.Sprintf("%s needs the %s controller of cgroup v2, which the agent's cgroup does not offer (its "+
		"cgroup.controllers; on a hybrid host it sits in cgroup v1, where deployd does not apply it); boot with "+
		"systemd.unified_cgroup_hierarchy=1, or give the agent's service Delegate=yes", k.Name, k.Controller)
}

// hasController reports whether children of the cgroup v2 dir can have
// controller c: it is in dir's cgroup.controllers (enabled for them by
// enableController).
func hasController(dir, c string) bool {
	b, err := readBounded(filepath.Join(dir, "cgroup.controllers"), 4096)
	return err == nil && slicesContains(strings.Fields(string(b)), c)
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// enableController enables c for the children of the cgroup v2 dir.
func enableController(dir, c string) error {
	b, _ := readBounded(filepath.Join(dir, "cgroup.subtree_control"), 4096)
	if slicesContains(strings.Fields(string(b)), c) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
		return fmt.Errorf("enable the %s controller in %s: %w", c, dir, err)
	}
	return nil
}

// writable is nil when the agent may make a folder in dir.
func writable(dir string) error {
	probe := filepath.Join(dir, fmt.Sprintf("deployd-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return fmt.Errorf("make a cgroup in %s: %w", dir, err)
	}
	_ = os.Remove(probe)
	return nil
}

// writeFile writes one value to a cgroup file.
func writeFile(dir, name, value string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0); err != nil {
		return fmt.Errorf("procunit: write %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// Limit applies l to the unit before its command starts (Join after).
// A limit the unit's cgroup v2 has a controller for is written there;
// else memory_max, cpu_weight, cpu_max and pids_max go to a cgroup of the
// unit in the controller's cgroup v1 hierarchy. It returns what could not
// apply, and why: nothing is left silent.
func (u *Unit) Limit(l Limits) []Unapplied {
	var out []Unapplied
	for _, k := range Keys {
		if !k.set(l) {
			continue
		}
		if err := u.limit(k, l); err != nil {
			out = append(out, Unapplied{k.Name, err.Error()})
		}
	}
	return out
}

func (u *Unit) limit(k Key, l Limits) error {
	if u.cg != nil {
		if parent := filepath.Dir(u.cg.dir); hasController(parent, k.Controller) {
			if err := enableController(parent, k.Controller); err != nil {
				return err
			}
			return writeV2(u.cg.dir, k.Name, l)
		}
	}
	if why := support(k); why != "" {
		return errors.New(why)
	}
	dir, err := u.v1Cgroup(k.Controller)
	if err != nil {
		return err
	}
	return writeV1(dir, k.Name, l)
}

// writeV2 writes key's cgroup v2 file.
func writeV2(dir, key string, l Limits) error {
	switch key {
	case "memory_high":
		return writeFile(dir, "memory.high", strconv.FormatInt(l.MemoryHigh, 10))
	case "memory_max":
		return writeFile(dir, "memory.max", strconv.FormatInt(l.MemoryMax, 10))
	case "cpu_weight":
		return writeFile(dir, "cpu.weight", strconv.Itoa(l.CPUWeight))
	case "cpu_max":
		period := cpuPeriod.Microseconds()
		return writeFile(dir, "cpu.max", fmt.Sprintf("%d %d", int64(l.CPUMax)*period/100, period))
	case "pids_max":
		return writeFile(dir, "pids.max", strconv.Itoa(l.PidsMax))
	case "io_weight":
		return writeFile(dir, "io.weight", "default "+strconv.Itoa(l.IOWeight))
	}
	return fmt.Errorf("procunit: unknown limit %s", key)
}

// writeV1 writes key's cgroup v1 file(s).
func writeV1(dir, key string, l Limits) error {
	switch key {
	case "memory_max":
		return writeFile(dir, "memory.limit_in_bytes", strconv.FormatInt(l.MemoryMax, 10))
	case "cpu_weight":
		return writeFile(dir, "cpu.shares", strconv.FormatUint(WeightToShares(l.CPUWeight), 10))
	case "cpu_max":
		period := cpuPeriod.Microseconds()
		if err := writeFile(dir, "cpu.cfs_period_us", strconv.FormatInt(period, 10)); err != nil {
			return err
		}
		return writeFile(dir, "cpu.cfs_quota_us", strconv.FormatInt(int64(l.CPUMax)*period/100, 10))
	case "pids_max":
		return writeFile(dir, "pids.max", strconv.Itoa(l.PidsMax))
	}
	return fmt.Errorf("procunit: %s has no cgroup v1 file", key)
}

// WeightToShares maps a cgroup v2 CPU weight (1..10000, default 100) to
// cgroup v1 cpu.shares (2..262144, default 1024) as systemd does: in
// proportion to the defaults, clamped to the range of shares.
func WeightToShares(w int) uint64 {
	return uint64(min(max(int64(w)*1024/100, 2), 262144))
}
