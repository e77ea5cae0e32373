package logs

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tornAppend leaves what an agent SIGKILLed in the middle of writing a
// batch of j's lines leaves (the write was cut between two pages): the
// append recorded in j, and its first part (cut within a line) at the end
// of the log file at path. The lines are the pipe's, already moved into j.
func tornAppend(t *testing.T, j *Journal, r *os.File, path string) {
	t.Helper()
	if err := j.fill(r); err != nil {
		t.Fatal(err)
	}
	var lines []byte
	k := deliver(j.pending, 0, DefaultMaxLine, false, func(s string) {
		lines = appendLine(lines, FormatRaw, &Line{Text: s})
	})
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if err := j.record(0, FilePos{Dev: st.Dev, Ino: st.Ino, Size: st.Size}, lines, j.lanes[0].done+int64(k)); err != nil {
		t.Fatal(err)
	}
	cut := len(lines) / 2
	for lines[cut-1] == '\n' {
		cut++
	}
	if _, err := f.Write(lines[:cut]); err != nil {
		t.Fatal(err)
	}
}

// pipeOf is a pipe that holds "<name> 1" .. "<name> n", one a line, and
// has no writer left.
func pipeOf(t *testing.T, name string, n int) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s %d\n", name, i)
	}
	if _, err := w.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return r
}

// takeJournal is the next agent's copy of j (the worker kept one).
func takeJournal(t *testing.T, j *Journal) *Journal {
	t.Helper()
	fd, err := unix.Dup(int(j.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	nj, err := OpenJournal(os.NewFile(uintptr(fd), "journal"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nj.Close() })
	return nj
}

// Two workers write to one log file. The agent is SIGKILLed while it
// writes a batch of worker A's lines: a torn append, recorded in A's
// journal. The next agent adopts both; worker B's reader may append before
// A's reader settles that append (goroutines of two workers, in no given
// order), and then the torn part is no longer at the file's end: it can
// no longer be cut off, the batch is written again after B's lines (the
// torn part's lines twice) and B's first line is glued to the torn line
// (missing); B's lines, had they been fewer than the torn part lacks,
// would have been cut off with it. So adoption settles every journal
// (Journal.Settle) before any reader starts; this test has B's reader
// run first.
func TestJournalTornAppendIsSettledBeforeAnotherWorkerWrites(t *testing.T) {
	path := testPath(t)
	if err := os.MkdirAll(path[:strings.LastIndexByte(path, '/')], 0o755); err != nil {
		t.Fatal(err)
	}
	const nA, nB = 400, 300
	ra, rb := pipeOf(t, "a", nA), pipeOf(t, "b", nB)
	ja, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	defer ja.Close()
	jb, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	defer jb.Close()
	tornAppend(t, ja, ra, path)

	// The next agent.
	s, err := OpenSink(Options{Path: path, Format: FormatRaw})
	if err != nil {
		t.Fatal(err)
	}
	na, nb := takeJournal(t, ja), takeJournal(t, jb)
	for _, j := range []*Journal{na, nb} {
		if err := j.Settle(s); err != nil {
			t.Fatal(err)
		}
	}
	line := func(text string) Line { return Line{Time: time.Now(), App: "web", Stream: "out", Text: text} }
	for _, c := range []struct {
		r *os.File
		j *Journal
	}{{rb, nb}, {ra, na}} {
		if err := CaptureJournaled(c.r, c.j, nil, s, 0, line, func(string) {}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, l := range readLines(t, path) {
		seen[l]++
	}
	var twice, missing []string
	for name, n := range map[string]int{"a": nA, "b": nB} {
		for i := 1; i <= n; i++ {
			switch l := fmt.Sprintf("%s %d", name, i); seen[l] {
			case 0:
				missing = append(missing, l)
			case 1:
			default:
				twice = append(twice, l)
			}
			delete(seen, fmt.Sprintf("%s %d", name, i))
		}
	}
	if len(twice)+len(missing)+len(seen) > 0 {
		t.Errorf("%d lines twice (%s ...), missing %q, others %v", len(twice), strings.Join(twice[:min(3, len(twice))], ", "), missing, seen)
	}
}
