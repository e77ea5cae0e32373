package procstat

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and parentheses, as a process can choose.
	line := "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 7 0 98765 123456789 2048 " +
		"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	s, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{UTime: 250, STime: 75, NumThreads: 7, StartTicks: 98765, VSize: 123456789, RSSPages: 2048}
	if s != want {
		t.Fatalf("parsed %+v, want %+v", s, want)
	}
	if got := s.CPUSeconds(); got != 3.25 {
		t.Errorf("CPUSeconds %v, want 3.25", got)
	}
	for _, bad := range []string{"", "4242 (app", "4242 (app) S 1 2 3", "4242 (app) S 1 4242 4242 0 -1 4194560 1234 0 0 0 x 75 0 0 20 0 7 0 98765 1 2"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestSelf(t *testing.T) {
	var fs FS
	s, err := fs.Stat(0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := fs.Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSSBytes() <= 0 || s.NumThreads < 1 || p.StartTicks != s.StartTicks {
		t.Errorf("self %+v, by pid %+v", s, p)
	}
	if bt, err := fs.BootTime(); err != nil || bt < 1e9 {
		t.Errorf("BootTime %d, %v", bt, err)
	}
	if n, err := fs.OpenFDs(); err != nil || n < 3 {
		t.Errorf("OpenFDs %d, %v", n, err)
	}
}

// TestStatAllocations guards the reason Stat reads into a stack buffer: the
// agent calls it for every worker every second, and its garbage made an
// idle agent's heap grow to the GC's goal between collections.
func TestStatAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector; `go test ./...` checks them")
	}
	var fs FS
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := fs.Stat(0); err != nil {
			t.Fatal(err)
		}
	})
	// The path string and its copy for open(2).
	if allocs > 2 {
		t.Errorf("Stat allocates %.0f times per call, want at most 2", allocs)
	}
}

func TestParseNumbers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"42", 42, true}, {"-1", -1, true}, {"9223372036854775807", 1<<63 - 1, true},
		{"9223372036854775808", 0, false}, {"", 0, false}, {"-", 0, false}, {"1x", 0, false}, {"+1", 0, false},
	} {
		if got, ok := parseInt([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("parseInt(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	if v, ok := parseUint([]byte("18446744073709551615")); !ok || v != 1<<64-1 {
		t.Errorf("parseUint(max) = %d, %v", v, ok)
	}
	if _, ok := parseUint([]byte("18446744073709551616")); ok {
		t.Error("parseUint(max+1): no error")
	}
}
