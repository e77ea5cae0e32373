package logs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func writeRaw(t *testing.T, s *Sink, texts ...string) {
	t.Helper()
	for _, text := range texts {
		s.Write(Line{Text: text})
	}
	flush(t, s)
}

func numbers(from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

func TestLastLinesAcrossRotation(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw})
	writeRaw(t, s, numbers(1, 10)...)
	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, numbers(11, 20)...)
	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, numbers(21, 23)...)

	for _, tc := range []struct {
		n    int
		want []string
	}{
		{2, numbers(22, 23)},
		{3, numbers(21, 23)},
		{5, numbers(19, 23)},
		{15, numbers(9, 23)},
		{100, numbers(1, 23)},
		{0, nil},
	} {
		got, err := LastLines(path, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("LastLines(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}

	// The same with the newest rotated file compressed.
	backups, err := listBackups(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := compressFile(backups[0].path); err != nil {
		t.Fatal(err)
	}
	got, err := LastLines(path, 15)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(numbers(9, 23)) {
		t.Errorf("with a compressed file: %q", got)
	}
}

func TestLastLinesOfAFile(t *testing.T) {
	path := testPath(t)
	long := strings.Repeat("x", 3*tailBlock+17)
	for _, tc := range []struct {
		name, content string
		n             int
		want          []string
	}{
		{"empty", "", 3, nil},
		{"one empty line", "\n", 3, []string{""}},
		{"no final newline", "a\nb\nc", 2, []string{"b", "c"}},
		{"blank lines", "a\n\n\nb\n", 3, []string{"", "", "b"}},
		{"lines longer than a block", "first\n" + long + "\n" + long + "\n", 2, []string{long, long}},
		{"many blocks", strings.Repeat("line\n", 100_000) + "last\n", 2, []string{"line", "last"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(tc.content), 0o640); err != nil {
				t.Fatal(err)
			}
			got, err := LastLines(path, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || len(got) != len(tc.want) {
				t.Errorf("got %d lines %.40q, want %d", len(got), got, len(tc.want))
			}
		})
	}
	if _, err := LastLines(path+".missing", 3); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// follow runs Follow in a goroutine; the lines arrive on the channel.
// Cleanup stops it and waits for it.
func follow(t *testing.T, path string, from int64) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 1000)
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, path, from, func(l string) { lines <- l }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follow: %v", err)
		}
	})
	return lines
}

// expect waits for the next lines from Follow; the timeout only guards
// against a hang.
func expect(t *testing.T, lines <-chan string, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-lines:
			if got != w {
				t.Fatalf("followed %q, want %q", got, w)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("followed nothing, want %q", w)
		}
	}
}

func TestFollowAcrossRotation(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw})
	writeRaw(t, s, "before follow")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := follow(t, path, st.Size())

	writeRaw(t, s, "a1")
	expect(t, lines, "a1")

	// a2 reaches the old file, which is renamed before Follow may have read
	// it: Follow must finish the old file before it opens the new one.
	writeRaw(t, s, "a2")
	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "b1", "b2")
	expect(t, lines, "a2", "b1", "b2")

	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "c1")
	expect(t, lines, "c1")

	if err := s.Truncate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "after truncate")
	expect(t, lines, "after truncate")
}

func TestFollowWaitsForTheFile(t *testing.T) {
	path := testPath(t)
	lines := follow(t, path, 0)
	s := open(t, Options{Path: path, Format: FormatRaw})
	writeRaw(t, s, "first", "second")
	expect(t, lines, "first", "second")
}

func TestFollowInPlaceTruncation(t *testing.T) {
	path := testPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("a longer first line\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	lines := follow(t, path, 0)
	expect(t, lines, "a longer first line")
	if err := os.WriteFile(path, []byte("short\n"), 0o640); err != nil { // copytruncate
		t.Fatal(err)
	}
	expect(t, lines, "short")
}
