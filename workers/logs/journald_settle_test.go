package logs

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// journaldSink is a next agent's Sink of target = "journal" on fj.
func journaldSink(t *testing.T, fj *fakeJournal) *Sink {
	t.Helper()
	s, err := OpenSink(Options{Path: testPath(t), Target: TargetJournal, Open: func(Options) (File, error) {
		return &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sentPartly leaves what an agent SIGKILLed in the middle of sending a
// batch of j's lines to the journal leaves: the append recorded in j, and
// its first sent entries in fj. The lines are the pipe's, moved into j.
func sentPartly(t *testing.T, j *Journal, fj *fakeJournal, sent int) {
	t.Helper()
	if err := j.fill(pipeOf(t, "a", 10)); err != nil {
		t.Fatal(err)
	}
	var data []byte
	k := deliver(j.pending, 0, DefaultMaxLine, false, func(s string) {
		data = appendLine(data, formatJournald, &Line{App: "web", PID: 77, Stream: "out", Text: s})
	})
	dead := &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}
	pos, _ := dead.position(len(data))
	if err := j.record(pos, data, j.done+int64(k)); err != nil {
		t.Fatal(err)
	}
	fj.fail = sent
	_, _ = dead.writeWhole(data) // killed after sent entries
	fj.fail = 1 << 30
}

// An agent is SIGKILLed after it sent 4 of a batch's 10 lines to the
// journal. The next agent settles the batch (4 of it are there) and is
// SIGKILLed too, before it sent the rest. The agent after that must send
// the other 6 only: what the second agent learnt is in the worker's
// journal, not only in its memory (which died with it: the first 4 lines
// twice in the journal, 2 633 lines in a run of
// TestRealSystemdJournalEveryLineOnce).
func TestJournaldSettledBatchSurvivesTheNextAgentsKill(t *testing.T) {
	fj := &fakeJournal{}
	j, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	sentPartly(t, j, fj, 4)

	second := takeJournal(t, j)
	s2 := journaldSink(t, fj)
	if err := second.Settle(s2); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil { // killed before its reader sent anything
		t.Fatal(err)
	}

	third := takeJournal(t, second)
	s3 := journaldSink(t, fj)
	line := func(text string) Line { return Line{Time: time.Now(), App: "web", PID: 77, Stream: "out", Text: text} }
	eof := pipeOf(t, "a", 0) // the worker's pipe, empty now: its 10 lines are in the journal memfd
	if err := CaptureJournaled(eof, third, nil, s3, 0, line, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if err := s3.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range fj.entries {
		if e["DEPLOYD_BARRIER"] == "" {
			seen[e["MESSAGE"]]++
		}
	}
	for i := 1; i <= 10; i++ {
		if n := seen[fmt.Sprintf("a %d", i)]; n != 1 {
			t.Errorf("line %d in the journal %d times", i, n)
		}
	}
	if len(seen) != 10 {
		t.Errorf("entries %v, want a 1 .. a 10", seen)
	}
}
