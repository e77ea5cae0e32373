package logs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestSinkConcurrentWritersWithRotation(t *testing.T) {
	const writers, perWriter = 4, 100_000
	path := testPath(t)
	s := open(t, Options{Path: path, MaxSize: 1 << 20})

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				s.Write(Line{App: "web", Slot: w, PID: 1000 + w, Stream: "out", Text: fmt.Sprintf("line %d %07d", w, i)})
				if i%1000 == 999 { // keep within the queue, so nothing is dropped
					flush(t, s)
				}
			}
		})
	}
	wg.Go(func() { // rotations by request, racing the automatic ones
		for range 3 {
			if err := s.Rotate(); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	flush(t, s)
	if d := s.Dropped(); d != 0 {
		t.Fatalf("dropped %d lines", d)
	}

	files := logFiles(t, path)
	if len(files) < 6 {
		t.Fatalf("%d files, want at least 5 rotated ones and the current one", len(files))
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 1<<20 {
			t.Errorf("%s: %d bytes, more than MaxSize", f, st.Size())
		}
	}
	var seen [writers][perWriter]bool
	next := [writers]int{}
	for _, l := range readLines(t, files...) {
		i := strings.Index(l, "] line ")
		if i < 0 {
			t.Fatalf("unexpected line %q", l)
		}
		var w, n int
		if _, err := fmt.Sscanf(l[i+2:], "line %d %d", &w, &n); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if seen[w][n] {
			t.Fatalf("line %d of writer %d twice", n, w)
		}
		if n != next[w] {
			t.Fatalf("writer %d: line %d, want %d (out of order)", w, n, next[w])
		}
		if want := fmt.Sprintf(" [web %d %d] ", w, 1000+w); !strings.Contains(l, want) {
			t.Fatalf("line %q lacks %q", l, want)
		}
		seen[w][n] = true
		next[w]++
	}
	for w := range writers {
		if next[w] != perWriter {
			t.Errorf("writer %d: %d lines, want %d", w, next[w], perWriter)
		}
	}
}

func TestSinkTextFormat(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path})
	at := time.Date(2026, 11, 30, 4, 22, 48, 123_456_789, time.FixedZone("CET", 3600))
	s.Write(Line{Time: at, App: "web", Slot: 2, PID: 4242, Stream: "out", Text: "message"})
	flush(t, s)
	got := readLines(t, path)
	want := []string{"2026-11-30T03:22:48.123Z [web 2 4242] message"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for p, mode := range map[string]os.FileMode{path: 0o640, filepath.Dir(path): 0o755} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), mode)
		}
	}
}

func TestSinkJSONFormat(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatJSON})
	texts := []string{"plain", `quote " and \ backslash`, "tab\tnul\x00 bell\a", "invalid \xff utf-8", "<html> & \u2028 ünïcode €", ""}
	for i, text := range texts {
		s.Write(Line{App: "web", Slot: i, PID: 4242, Stream: "err", Text: text})
	}
	flush(t, s)
	lines := readLines(t, path)
	if len(lines) != len(texts) {
		t.Fatalf("%d lines, want %d", len(lines), len(texts))
	}
	for i, l := range lines {
		var v struct {
			Time, App, Stream, Msg string
			Slot, PID              int
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, v.Time); err != nil || !strings.HasSuffix(v.Time, "Z") || len(v.Time) != len("2026-11-30T03:22:48.123Z") {
			t.Errorf("time %q: want RFC 3339 with ms in UTC (%v)", v.Time, err)
		}
		want := strings.ToValidUTF8(texts[i], "\uFFFD")
		if v.App != "web" || v.Slot != i || v.PID != 4242 || v.Stream != "err" || v.Msg != want {
			t.Errorf("line %d: got %+v, want msg %q", i, v, want)
		}
	}
}

// failingFile wraps the real file; while full is set, writes fail with ENOSPC.
type failingFile struct {
	File
	full atomic.Bool
}

func (f *failingFile) Write(p []byte) (int, error) {
	if f.full.Load() {
		return 0, &os.PathError{Op: "write", Path: "web.out.log", Err: syscall.ENOSPC}
	}
	return f.File.Write(p)
}

func TestSinkDiskFull(t *testing.T) {
	path := testPath(t)
	ff := &failingFile{}
	s := open(t, Options{Path: path, Open: func(o Options) (File, error) {
		f, err := newRotator(o)
		ff.File = f
		return ff, err
	}})
	s.Write(Line{App: "web", Text: "before"})
	flush(t, s)

	ff.full.Store(true)
	const lost = 1000
	for i := range lost {
		s.Write(Line{App: "web", Text: fmt.Sprint("lost ", i)})
	}
	err := s.Flush(t.Context())
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("flush on a full disk: %v, want ENOSPC", err)
	}
	if d := s.Dropped(); d != lost {
		t.Fatalf("dropped %d, want %d", d, lost)
	}

	ff.full.Store(false)
	s.Write(Line{App: "web", Text: "after"})
	flush(t, s)
	lines := readLines(t, path)
	if len(lines) != 3 {
		t.Fatalf("lines %q, want before, marker, after", lines)
	}
	want := "] deployd: dropped 1000 lines (write error: no space left on device)"
	if !strings.HasSuffix(lines[1], want) || !strings.Contains(lines[1], " [deployd] ") {
		t.Errorf("marker %q, want suffix %q", lines[1], want)
	}
	if !strings.HasSuffix(lines[0], "] before") || !strings.HasSuffix(lines[2], "] after") {
		t.Errorf("lines %q", lines)
	}
}

// stuckFile blocks its first Write until released, like a hung disk.
type stuckFile struct {
	File
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (f *stuckFile) Write(p []byte) (int, error) {
	f.once.Do(func() {
		close(f.entered)
		<-f.release
	})
	return f.File.Write(p)
}

func TestSinkWriteNeverBlocks(t *testing.T) {
	path := testPath(t)
	sf := &stuckFile{entered: make(chan struct{}), release: make(chan struct{})}
	const queue = 100
	s := open(t, Options{Path: path, Format: FormatRaw, BufferLines: queue, Open: func(o Options) (File, error) {
		f, err := newRotator(o)
		sf.File = f
		return sf, err
	}})
	s.Write(Line{Text: "first"})
	<-sf.entered // the writer goroutine is stuck writing "first"

	const n = 50_000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			s.Write(Line{Text: strconv.Itoa(i)})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Write blocked on a stuck disk")
	}
	if d, want := s.Dropped(), uint64(n-queue); d != want {
		t.Fatalf("dropped %d, want %d", d, want)
	}

	close(sf.release)
	flush(t, s)
	lines := readLines(t, path)
	if len(lines) != 1+queue+1 {
		t.Fatalf("%d lines, want %d", len(lines), 1+queue+1)
	}
	want := fmt.Sprintf("deployd: dropped %d lines (buffer full)", n-queue)
	if lines[0] != "first" || lines[1] != want || lines[2] != "0" || lines[len(lines)-1] != strconv.Itoa(queue-1) {
		t.Errorf("lines %q..., want first, %q, 0...", lines[:3], want)
	}
}

func TestSinkBufferBytes(t *testing.T) {
	path := testPath(t)
	sf := &stuckFile{entered: make(chan struct{}), release: make(chan struct{})}
	s := open(t, Options{Path: path, Format: FormatRaw, BufferBytes: 10, Open: func(o Options) (File, error) {
		f, err := newRotator(o)
		sf.File = f
		return sf, err
	}})
	s.Write(Line{Text: "first"})
	<-sf.entered
	for range 4 {
		s.Write(Line{Text: "1234"}) // 2 fit in 10 bytes
	}
	close(sf.release)
	flush(t, s)
	if d := s.Dropped(); d != 2 {
		t.Errorf("dropped %d, want 2", d)
	}
}

func TestSinkTruncate(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Compress: true})
	for i := range 3 {
		s.Write(Line{Text: fmt.Sprint("old ", i)})
		if err := s.Rotate(); err != nil {
			t.Fatal(err)
		}
	}
	s.Write(Line{Text: "old current"})
	if err := s.Truncate(); err != nil {
		t.Fatal(err)
	}
	s.Write(Line{Text: "new"})
	flush(t, s)
	if files := logFiles(t, path); len(files) != 1 {
		t.Errorf("files after truncate: %q", files)
	}
	if lines := readLines(t, path); len(lines) != 1 || !strings.HasSuffix(lines[0], " new") {
		t.Errorf("lines after truncate: %q", lines)
	}
}

func TestSinkMaxFiles(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw, MaxFiles: 2})
	for i := range 5 {
		s.Write(Line{Text: strconv.Itoa(i)})
		if err := s.Rotate(); err != nil {
			t.Fatal(err)
		}
	}
	s.Write(Line{Text: "5"})
	if err := s.Close(); err != nil { // waits for the mill to prune
		t.Fatal(err)
	}
	got := readLines(t, logFiles(t, path)...)
	if fmt.Sprint(got) != "[3 4 5]" {
		t.Errorf("lines %q, want the 2 newest rotated files and the current one", got)
	}
}

func TestSinkClose(t *testing.T) {
	path := testPath(t)
	s, err := OpenSink(Options{Path: path, Format: FormatRaw})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		s.Write(Line{Text: strconv.Itoa(i)})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if n := len(readLines(t, path)); n != 1000 {
		t.Errorf("%d lines written by close, want 1000", n)
	}
	s.Write(Line{Text: "late"})
	if s.Dropped() != 1 {
		t.Errorf("dropped %d after a write after close, want 1", s.Dropped())
	}
	if err := s.Flush(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("flush after close: %v, want ErrClosed", err)
	}
	if err := s.Rotate(); !errors.Is(err, ErrClosed) {
		t.Errorf("rotate after close: %v, want ErrClosed", err)
	}
}

func TestOpenSinkErrors(t *testing.T) {
	if _, err := OpenSink(Options{Path: testPath(t), Format: "xml"}); err == nil {
		t.Error("unknown format accepted")
	}
	if _, err := OpenSink(Options{}); err == nil {
		t.Error("empty path accepted")
	}
}

// Reconfigure (a reload that changed [apps.NAME.logs]) switches the format
// and the rotation size of an open sink; lines before it keep the old one.
func TestSinkReconfigure(t *testing.T) {
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw})
	s.Write(Line{App: "web", Stream: "out", Text: "before"})
	if err := s.Reconfigure(Options{Format: FormatJSON, MaxSize: 200}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		s.Write(Line{App: "web", Stream: "out", Text: fmt.Sprintf("after %d", i)})
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "before") || !strings.HasPrefix(string(b), "{") {
		t.Errorf("current file after a reconfigure to json with max_size 200:\n%s", b)
	}
	rotated, _ := filepath.Glob(strings.TrimSuffix(path, ".log") + "-*")
	if len(rotated) == 0 {
		t.Error("no rotation at the new max_size of 200 bytes")
	}
	if err := s.Reconfigure(Options{Format: "xml"}); err == nil {
		t.Error("reconfigure to an unknown format: no error")
	}
}
