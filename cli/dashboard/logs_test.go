package dashboard

import (
	"strings"
	"testing"
)

// A burst of long lines is held, and sent, within maxBytesPerTick: the
// last lines, after one that counts the others.
func TestLineBatchBoundedInBytes(t *testing.T) {
	var b lineBatch
	long := strings.Repeat("x", maxLineBytes)
	for i := range 1000 {
		b.add(LogEntry{T: int64(i), App: "web", Line: long})
	}
	ls := b.entries("web")
	kept := len(ls) - 1
	if kept != maxBytesPerTick/maxLineBytes || ls[0].Stream != "skip" ||
		ls[0].Line != "… 984 lines not shown (see deployd logs web)" || ls[len(ls)-1].T != 999 {
		t.Errorf("kept %d lines, first %+v, last T %d; want the last %d after a skip line",
			kept, ls[0].Line, ls[len(ls)-1].T, maxBytesPerTick/maxLineBytes)
	}
	var tail []LogEntry
	for _, l := range ls {
		tail = appendTail(tail, l, 200)
	}
	for range 100 {
		tail = appendTail(tail, LogEntry{Line: long}, 200)
	}
	if len(tail) != maxTailBytes/maxLineBytes {
		t.Errorf("tail of %d long lines, want %d", len(tail), maxTailBytes/maxLineBytes)
	}
}
