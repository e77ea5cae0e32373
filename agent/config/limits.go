package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/procunit"
)

// rawLimits are an app's resource limit keys (systemd's names, lower case).
type rawLimits struct {
	MemoryHigh toml.Primitive `toml:"memory_high"`
	MemoryMax  toml.Primitive `toml:"memory_max"`
	CPUWeight  toml.Primitive `toml:"cpu_weight"`
	CPUMax     toml.Primitive `toml:"cpu_max"`
	PidsMax    toml.Primitive `toml:"pids_max"`
	IOWeight   toml.Primitive `toml:"io_weight"`
}

// limitKeys are the keys rawLimits reads.
var limitKeys = []string{"memory_high", "memory_max", "cpu_weight", "cpu_max", "pids_max", "io_weight"}

// leastPids is the least pids_max: a runtime's own threads (node starts
// about a dozen) must fit under it.
const leastPids = 16

// limits decodes an app's resource limits into a.Limits.
func (d *decoder) limits(raw rawLimits, k func(string) []string, a *App) {
	l := &a.Limits
	d.size(raw.MemoryHigh, k("memory_high"), &l.MemoryHigh, true)
	d.size(raw.MemoryMax, k("memory_max"), &l.MemoryMax, true)
	d.weight(raw.CPUWeight, k("cpu_weight"), &l.CPUWeight)
	d.weight(raw.IOWeight, k("io_weight"), &l.IOWeight)
	d.integer(raw.PidsMax, k("pids_max"), &l.PidsMax, leastPids)
	if s, ok := get[string](d, raw.CPUMax, k("cpu_max")); ok {
		p, err := parsePercent(s)
		if err != nil {
			d.fail(k("cpu_max"), strconv.Quote(s), hint(nil, "%v; write a share of one CPU per 100 ms, e.g. cpu_max = \"150%%\" (one and a half CPUs)", err))
		} else {
			l.CPUMax = p
		}
	}
	if l.MemoryHigh > 0 && l.MemoryMax > 0 && l.MemoryHigh >= l.MemoryMax {
		d.fail(k("memory_high"), strconv.FormatInt(l.MemoryHigh, 10), hint(nil,
			"memory_high must be below memory_max (%d bytes): a worker is replaced at memory_high before the kernel kills it at memory_max; lower memory_high, e.g. to 80%% of memory_max", l.MemoryMax))
	}
}

// weight decodes a cgroup weight, 1..10000.
func (d *decoder) weight(p toml.Primitive, key []string, dst *int) {
	n, ok := get[int64](d, p, key)
	if !ok {
		return
	}
	if n < 1 || n > 10000 {
		d.fail(key, strconv.FormatInt(n, 10), hint(nil, "a weight is 1 to 10000 (100 is every other process's); e.g. %s = 1000 for ten times the default share", key[len(key)-1]))
		return
	}
	*dst = int(n)
}

// parsePercent parses cpu_max, "150%": a percentage of one CPU, > 0.
func parsePercent(s string) (int, error) {
	t, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	if !ok {
		return 0, fmt.Errorf("not a percentage")
	}
	n, err := strconv.Atoi(strings.TrimSpace(t))
	if err != nil || n < 1 || n > 100000 {
		return 0, fmt.Errorf("the percentage must be a whole number from 1 to 100000")
	}
	return n, nil
}

// checkLimits says which limits cannot apply on this host (tests set it).
var checkLimits = procunit.Check

// limitWarnings: the limits of each app that cannot apply here, and why.
func limitWarnings(c *Config, file string, kl keyLines) []Problem {
	var out []Problem
	for _, n := range c.AppNames {
		for _, u := range checkLimits(c.Apps[n].Limits) {
			key := []string{"apps", n, u.Key}
			out = append(out, Problem{File: file, Line: kl.find(key), Key: keyString(key),
				Msg: u.Key + " cannot apply on this host and is ignored: " + u.Why})
		}
	}
	return out
}
