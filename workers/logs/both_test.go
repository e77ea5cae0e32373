package logs

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// withJournald makes the journal Sinks the test opens send to fj.
func withJournald(t *testing.T, fj journaldConn) {
	t.Helper()
	conn, enabled := newJournaldConn, journalEnabled
	newJournaldConn, journalEnabled = func() journaldConn { return fj }, func() bool { return true }
	t.Cleanup(func() { newJournaldConn, journalEnabled = conn, enabled })
}

// bothSink is a next agent's Sink of target = "both": the files at path,
// the journal fj.
func bothSink(t *testing.T, path string, fj *fakeJournal) *Sink {
	t.Helper()
	withJournald(t, fj)
	s, err := OpenSink(Options{Path: path, Target: TargetBoth})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// onceEach fails unless the files at path and fj each hold prefix 1 .. n
// once, in order.
func onceEach(t *testing.T, path string, fj *fakeJournal, prefix string, n int) {
	t.Helper()
	var files, journal []string
	for _, l := range readLines(t, logFiles(t, path)...) {
		if _, text, ok := strings.Cut(l, "] "); ok && strings.HasPrefix(text, prefix+" ") {
			files = append(files, text)
		}
	}
	for _, e := range fj.entries {
		if strings.HasPrefix(e["MESSAGE"], prefix+" ") {
			journal = append(journal, e["MESSAGE"])
		}
	}
	var want []string
	for i := 1; i <= n; i++ {
		want = append(want, fmt.Sprintf("%s %d", prefix, i))
	}
	if w := strings.Join(want, ","); strings.Join(files, ",") != w || strings.Join(journal, ",") != w {
		t.Errorf("want %s once each in order\nfiles:   %v\njournal: %v", w, files, journal)
	}
}

// twoLanes is a journal of 2 lanes holding lines a 1 .. a 10 of the pipe,
// none done yet.
func twoLanes(t *testing.T) *Journal {
	t.Helper()
	j, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.use(2); err != nil {
		t.Fatal(err)
	}
	if err := j.fill(pipeOf(t, "a", 10)); err != nil {
		t.Fatal(err)
	}
	return j
}

// An agent with target = "both" is SIGKILLed after it wrote a batch of 10
// lines to the files and marked them done in their lane, and before the
// journal had all of them: before it recorded the journal's append, or
// after it sent 4 of its entries. The next agent gives the journal the
// lines it lacks, and the files nothing again.
func TestBothKillBetweenThePlaces(t *testing.T) {
	for _, c := range []struct {
		name     string
		recorded bool
		sent     int
	}{{"not recorded", false, 0}, {"recorded, none sent", true, 0}, {"recorded, 4 sent", true, 4}, {"recorded, all sent", true, 10}} {
		t.Run(c.name, func(t *testing.T) {
			path, fj := testPath(t), &fakeJournal{fail: 1 << 30}
			j := twoLanes(t)
			var lines []Line
			k := deliver(j.pending, 0, DefaultMaxLine, false, func(s string) {
				lines = append(lines, Line{Time: time.Now(), App: "web", PID: 77, Stream: "out", Text: s})
			})
			upto := j.lanes[0].done + int64(k)
			files := open(t, Options{Path: path})
			files.appendJournaled(j, 0, lines, upto)
			if err := j.commit(0, upto); err != nil {
				t.Fatal(err)
			}
			if c.recorded {
				var data []byte
				for i := range lines {
					data = appendLine(data, formatJournald, &lines[i])
				}
				dead := &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}
				pos, _ := dead.position(len(data))
				if err := j.record(1, pos, data, upto); err != nil {
					t.Fatal(err)
				}
				fj.fail = c.sent
				_, _ = dead.writeWhole(data) // killed after sent entries
				fj.fail = 1 << 30
			}

			next := takeJournal(t, j)
			s := bothSink(t, path, fj)
			line := func(text string) Line { return Line{Time: time.Now(), App: "web", PID: 77, Stream: "out", Text: text} }
			if err := CaptureJournaled(pipeOf(t, "b", 3), next, nil, s, 0, line, func(string) {}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			onceEach(t, path, fj, "a", 10)
			onceEach(t, path, fj, "b", 3)
		})
	}
}

// A journal an agent older than lanes wrote (lane 0 alone) is taken by an
// agent with target = "both": the journal's lane starts where the files'
// is, so it gets the lines from then on, and the files none again.
func TestBothTakesAJournalOfOneLane(t *testing.T) {
	path, fj := testPath(t), &fakeJournal{fail: 1 << 30}
	j, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	line := func(text string) Line { return Line{Time: time.Now(), App: "web", PID: 77, Stream: "out", Text: text} }
	files := open(t, Options{Path: path})
	if err := CaptureJournaled(pipeOf(t, "a", 5), j, nil, files, 0, line, func(string) {}); err != nil {
		t.Fatal(err)
	}
	flush(t, files)
	next := takeJournal(t, j)
	s := bothSink(t, path, fj)
	if err := CaptureJournaled(pipeOf(t, "b", 5), next, nil, s, 0, line, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, e := range fj.entries {
		if strings.HasPrefix(e["MESSAGE"], "a ") {
			t.Errorf("%q in the journal: it was done before the journal's lane", e["MESSAGE"])
		}
	}
	if got := len(readLines(t, logFiles(t, path)...)); got != 10 {
		t.Errorf("%d lines in the files, want a 1..5 and b 1..5", got)
	}
	onceEach(t, path, fj, "b", 5)
}

// An agent with lanes wrote both lanes; then an older agent (a failed
// upgrade back to it) moved lane 0 on, writing its block alone. The next
// agent with lanes takes lane 1 for stale (its bytes may be given back
// since) and starts it where lane 0 is.
func TestJournalStaleLaneIsDropped(t *testing.T) {
	j := twoLanes(t)
	if n := takeJournal(t, j).n; n != 2 {
		t.Fatalf("a journal of 2 lanes read as %d", n)
	}
	var block [blockSize]byte
	putBlock(block[:], journalMagic, lane{done: j.end}) // the older agent's commit
	if _, err := j.File().WriteAt(block[:], 0); err != nil {
		t.Fatal(err)
	}
	next := takeJournal(t, j)
	if next.n != 1 || next.lanes[0].done != j.end || len(next.pending) != 0 {
		t.Errorf("lanes %d, done %d, pending %d; want 1 lane done at %d, none pending", next.n, next.lanes[0].done, len(next.pending), j.end)
	}
	var h [headerSize]byte
	if _, err := j.File().ReadAt(h[:], 0); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(h[lane1Off:]); got != laneMagic {
		t.Fatalf("lane 1's block: magic %x", got)
	}
}

// A reload that changes target from "files" to "both" gives the Sink a
// twin for the journal; one back to "files" closes it.
func TestReconfigureBoth(t *testing.T) {
	path, fj := testPath(t), &fakeJournal{fail: 1 << 30}
	withJournald(t, fj)
	s := open(t, Options{Path: path})
	s.Write(Line{App: "web", Stream: "out", Text: "a 1"})
	if err := s.Reconfigure(Options{Target: TargetBoth}); err != nil {
		t.Fatal(err)
	}
	s.Write(Line{App: "web", Stream: "out", Text: "a 2"})
	flush(t, s)
	twin := s.twin.Load()
	if twin == nil {
		t.Fatal("no twin after target = both")
	}
	if err := s.Reconfigure(Options{Target: TargetFiles}); err != nil {
		t.Fatal(err)
	}
	s.Write(Line{App: "web", Stream: "out", Text: "a 3"})
	flush(t, s)
	if s.twin.Load() != nil || twin.Flush(t.Context()) == nil {
		t.Error("the twin is still there, or still open, after target = files")
	}
	if got := len(readLines(t, logFiles(t, path)...)); got != 3 {
		t.Errorf("%d lines in the file, want 3", got)
	}
	if len(fj.entries) != 1 || fj.entries[0]["MESSAGE"] != "a 2" {
		t.Errorf("journal entries %v, want a 2 alone", fj.entries)
	}
}
