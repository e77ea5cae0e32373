package config

import (
	"strings"
	"testing"

	"github.com/deployd/deployd/internal/procunit"
)

func TestLimitKeys(t *testing.T) {
	cfg, err := Load(writeConfig(t, web+"memory_high = \"48MiB\"\nmemory_max = \"64MiB\"\ncpu_weight = 50\ncpu_max = \"150%\"\npids_max = 64\nio_weight = 200\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := procunit.Limits{MemoryHigh: 48 << 20, MemoryMax: 64 << 20, CPUWeight: 50, CPUMax: 150, PidsMax: 64, IOWeight: 200}
	if got := cfg.Apps["web"].Limits; got != want {
		t.Errorf("limits %+v, want %+v", got, want)
	}
	for body, msg := range map[string]string{
		"memory_high = \"80MiB\"\nmemory_max = \"64MiB\"\n": "memory_high must be below memory_max",
		"cpu_max = \"1.5\"\n":                               `not a percentage; write a share of one CPU per 100 ms, e.g. cpu_max = "150%"`,
		"cpu_max = \"0%\"\n":                                "the percentage must be a whole number from 1 to 100000",
		"pids_max = 3\n":                                    "must be at least 16; e.g. pids_max = 512",
		"cpu_weight = 0\n":                                  "a weight is 1 to 10000",
		"io_weight = 20000\n":                               "a weight is 1 to 10000",
		"memory_max = \"lots\"\n":                           "memory_max",
	} {
		if _, err := Load(writeConfig(t, web+body)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: err %v, want one with %q", body, err, msg)
		}
	}
}

// A limit that cannot apply on the host is a warning naming the key and
// why, never silence.
func TestWarnsLimitsThatCannotApply(t *testing.T) {
	defer func(f func(procunit.Limits) []procunit.Unapplied) { checkLimits = f }(checkLimits)
	checkLimits = func(l procunit.Limits) []procunit.Unapplied {
		if l.PidsMax == 0 {
			return nil
		}
		return []procunit.Unapplied{{Key: "pids_max", Why: "no pids controller"}}
	}
	path := writeConfig(t, web+"pids_max = 64\n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := path + ":3: apps.web.pids_max: pids_max cannot apply on this host and is ignored: no pids controller"
	if len(cfg.Warnings) != 1 || cfg.Warnings[0].String() != want {
		t.Fatalf("warnings %v, want %q", cfg.Warnings, want)
	}
}
