package logs

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
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
	if err := j.record(0, pos, data, j.lanes[0].done+int64(k)); err != nil {
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

// slowJournal is a journald that takes a while per entry, as the real one
// does (a few thousand entries a second on a busy machine); safe for
// concurrent use.
type slowJournal struct {
	mu      sync.Mutex
	entries []string
}

func (f *slowJournal) Send(msg string, _ journal.Priority, _ map[string]string) error {
	time.Sleep(time.Millisecond) // the speed of journald, not a wait for a condition
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = append(f.entries, msg)
	return nil
}

func (f *slowJournal) Count(string, string) ([]appendEntry, error) { return nil, nil }

func (f *slowJournal) has(msg string) (n int, found bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.entries), slices.Contains(f.entries, msg)
}

// Worker A's batch of 3 000 lines takes the journal seconds; while it is
// being sent, worker B prints one line. The write of A's batch moves on,
// so it is not stalled: B's line must be sent (and recorded) before B's
// journal marks it done, as every line is. Taking the moving write for a
// stalled one (it lasted more than stallTimeout) put B's line in the
// Sink's queue only, marked done at once: an agent SIGKILL then lost it.
func TestJournaldLongBatchIsNoStall(t *testing.T) {
	fj := &slowJournal{}
	s, err := OpenSink(Options{Path: testPath(t), Target: TargetJournal, Open: func(Options) (File, error) {
		return &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	capture := func(name string, r *os.File) error {
		j, err := NewJournal(name)
		if err != nil {
			return err
		}
		defer j.Close()
		line := func(text string) Line { return Line{Time: time.Now(), App: "web", PID: 7, Stream: "out", Text: text} }
		return CaptureJournaled(r, j, nil, s, 0, line, func(string) {})
	}
	a := make(chan error, 1)
	go func() { a <- capture("a", pipeOf(t, "a", 3000)) }()
	// A's batch has been in the journal's write for longer than stallTimeout.
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		if n, _ := fj.has(""); n > 0 && time.Since(start) > 2*stallTimeout {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("A's lines did not reach the journal in 30 s")
		}
	}
	if err := capture("b", pipeOf(t, "b", 1)); err != nil {
		t.Fatal(err)
	}
	n, found := fj.has("b 1")
	if !found {
		t.Errorf("B's line was marked done in its journal while not sent (%d of A's lines were): an agent SIGKILL now loses it", n)
	}
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := fj.has(""); n != 3001 {
		t.Errorf("%d entries, want 3 001", n)
	}
}
