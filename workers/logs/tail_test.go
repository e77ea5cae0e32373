package logs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamAll runs StreamLast and returns its lines.
func streamAll(t *testing.T, path string, n int) ([]string, Position) {
	t.Helper()
	var got []string
	end, err := StreamLast(path, n, func(l string) error {
		got = append(got, l)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	end.Close()
	return got, end.Position
}

// StreamLast gives the lines LastLines gives across plain and compressed
// rotated files, leaves the current file's unfinished line to a follow,
// and says where it stopped.
func TestStreamLastAcrossRotation(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw})
	writeRaw(t, s, numbers(1, 10)...)
	for _, more := range [][]string{numbers(11, 20), numbers(21, 30)} {
		if err := s.Rotate(); err != nil {
			t.Fatal(err)
		}
		writeRaw(t, s, more...)
	}
	backups, err := listBackups(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := compressFile(backups[1].path); err != nil { // lines 1 to 10
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("being writ"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 10, 11, 25, 100} {
		got, pos := streamAll(t, path, n)
		want := numbers(max(31-n, 1), 30)
		if n == 0 {
			want = nil
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("StreamLast(%d) = %q, want %q", n, got, want)
		}
		if st, _ := os.Stat(path); pos.Offset != st.Size()-int64(len("being writ")) || pos.Ino == 0 {
			t.Errorf("StreamLast(%d) stopped at %+v; want the start of the unfinished line", n, pos)
		}
	}
	if got, _ := LastLines(path, 2); fmt.Sprint(got) != "[30 being writ]" {
		t.Errorf("LastLines(2) = %q: it counts the unfinished line", got)
	}
}

// An error from fn stops StreamLast at once and comes back as is; a log
// with no file is fs.ErrNotExist.
func TestStreamLastStops(t *testing.T) {
	path := testPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Repeat("x\n", 1000)), 0o640); err != nil {
		t.Fatal(err)
	}
	gone := errors.New("client gone")
	calls := 0
	_, err := StreamLast(path, 1000, func(string) error {
		calls++
		return gone
	})
	if err != gone || calls != 1 {
		t.Errorf("StreamLast after fn failed: %v after %d calls; want fn's error after 1", err, calls)
	}
	if _, err := StreamLast(path+".missing", 3, func(string) error { return nil }); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing log: %v", err)
	}
}

// Lines longer than maxTailLine come in chunks; none is lost or added.
func TestStreamLastLongLine(t *testing.T) {
	path := testPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("y", 2*maxTailLine)
	if err := os.WriteFile(path, []byte("a\n"+long+"\nb\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	got, _ := streamAll(t, path, 3)
	if len(got) < 4 || got[0] != "a" || got[len(got)-1] != "b" || strings.Join(got[1:len(got)-1], "") != long {
		t.Errorf("got %d lines, want a, the long line in chunks, b", len(got))
	}
	for _, l := range got {
		if len(l) > maxTailLine+tailBlock {
			t.Errorf("a chunk of %d bytes", len(l))
		}
	}
}

// The memory StreamLast holds does not grow with n: the heap in use while
// fn takes the last of 100 000 lines of 200 bytes (20 MB) is within a
// few blocks of what it was before. Reading them whole took the 20 MB
// three times over.
func TestStreamLastHoldsABlock(t *testing.T) {
	path := testPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 100_000 {
		fmt.Fprintf(&b, "%06d %s\n", i, strings.Repeat("z", 192))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o640); err != nil {
		t.Fatal(err)
	}
	b = strings.Builder{}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	var peak uint64
	lines := 0
	_, err := StreamLast(path, 100_000, func(string) error {
		if lines++; lines%25_000 == 0 {
			peak = max(peak, heap())
		}
		return nil
	})
	if err != nil || lines != 100_000 {
		t.Fatalf("%d lines, %v", lines, err)
	}
	t.Logf("heap before %d KiB, at most %d KiB while streaming 100 000 lines", before>>10, peak>>10)
	if peak > before+1<<20 {
		t.Errorf("the heap grew by %d KiB while streaming; want at most 1 MiB", (peak-before)>>10)
	}
}

// Follows that wait for lines hold no read block: 200 of them, after each
// delivered a line, add well under their 200 blocks (12.5 MiB) to the heap.
// A client following every app's log runs one per app.
func TestIdleFollowsHoldNoBlock(t *testing.T) {
	dir := t.TempDir()
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const follows = 200
	before := heap()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	got := make(chan string, follows)
	for i := range follows {
		path := filepath.Join(dir, fmt.Sprintf("app%d.out.log", i))
		if err := os.WriteFile(path, []byte(fmt.Sprintf("line of %d\n", i)), 0o640); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := Follow(ctx, path, 0, func(l string) { got <- l }); err != nil {
				t.Error(err)
			}
		})
	}
	for range follows {
		<-got
	}
	grew := int64(heap()) - int64(before)
	t.Logf("%d idle follows: heap grew by %d KiB", follows, grew>>10)
	if grew > follows*tailBlock/4 {
		t.Errorf("%d idle follows hold %d KiB; want far less than a block each", follows, grew>>10)
	}
}

// A follow goes on in the file the tail read, even when that was rotated
// and compressed while a slow client took the tail: no line is lost or
// shown twice.
func TestTailedFollowAcrossRotation(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw, Compress: true})
	writeRaw(t, s, numbers(1, 5)...)
	var got []string
	end, err := StreamLast(path, 2, func(l string) error {
		got = append(got, l)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "6")
	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "7")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if bs, err := listBackups(path); err == nil && len(bs) == 1 && bs[0].gz {
			break // the file the tail read is gone: only the tail holds it
		}
		if time.Now().After(deadline) {
			t.Fatal("the rotated file was not compressed within 10s")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		_, err := end.Follow(ctx, path, func(l string) { lines <- l })
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	expect(t, lines, "6", "7")
	if fmt.Sprint(got) != "[4 5]" {
		t.Errorf("tail %q, want [4 5]", got)
	}
}
