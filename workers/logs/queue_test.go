package logs

import (
	"strconv"
	"testing"
)

// An idle queue holds no memory for the lines of a burst that is over, and
// a full one refuses lines.
func TestLineQueueLetsGoOfABurst(t *testing.T) {
	q := newLineQueue(DefaultBufferLines)
	for i := range DefaultBufferLines {
		if !q.push(Line{Text: strconv.Itoa(i)}) {
			t.Fatalf("push %d refused below the limit", i)
		}
	}
	if q.push(Line{Text: "one too many"}) {
		t.Fatal("push accepted a line over the limit")
	}
	b := q.take()
	if len(b) != DefaultBufferLines || b[0].Text != "0" || b[len(b)-1].Text != strconv.Itoa(DefaultBufferLines-1) {
		t.Fatalf("took %d lines, want %d in order", len(b), DefaultBufferLines)
	}
	q.done(b)
	for i := range 500 { // the quiet traffic after the burst: one line per batch
		q.push(Line{Text: strconv.Itoa(i)})
		if b := q.take(); len(b) != 1 {
			t.Fatalf("batch of %d lines, want 1", len(b))
		} else {
			q.done(b)
		}
	}
	if c := cap(q.lines) + cap(q.spare); c > keepLines {
		t.Errorf("an idle queue keeps room for %d lines, want at most %d", c, keepLines)
	}
	if q.len() != 0 || q.take() != nil {
		t.Error("lines left after every batch was taken")
	}
}

// A writer that has been idle for idleTrim lets go of the queue's arrays.
func TestLineQueueTrim(t *testing.T) {
	q := newLineQueue(DefaultBufferLines)
	for i := range 5000 {
		q.push(Line{Text: strconv.Itoa(i)})
	}
	b := q.take()
	for range 1000 { // a burst arrives while the first batch is written
		q.push(Line{Text: "x"})
	}
	q.done(b)
	q.done(q.take())
	if cap(q.lines)+cap(q.spare) <= keepLines {
		t.Fatal("the burst's arrays are gone before the trim: the test shows nothing")
	}
	q.trim()
	if c := cap(q.lines) + cap(q.spare); c > keepLines {
		t.Errorf("a trimmed queue keeps room for %d lines, want at most %d", c, keepLines)
	}
}
