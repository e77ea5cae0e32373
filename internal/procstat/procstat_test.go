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
