package dashboard

import "fmt"

// lineBatch is one app's log lines since the last flush: the last
// maxLinesPerTick of them within maxBytesPerTick; the older ones are only
// counted, so a chatty app costs the hub no more than that until the
// flush.
type lineBatch struct {
	lines   []LogEntry
	bytes   int
	skipped int
}

func (b *lineBatch) add(l LogEntry) {
	b.lines = append(b.lines, l)
	b.bytes += len(l.Line)
	for len(b.lines) > 1 && (len(b.lines) > maxLinesPerTick || b.bytes > maxBytesPerTick) {
		b.bytes -= len(b.lines[0].Line)
		b.lines[0] = LogEntry{} // let go of the line: the array lives on
		b.lines = b.lines[1:]
		b.skipped++
	}
}

// entries are the batch as the pages get it: first a line that says how
// many were not shown, if any.
func (b *lineBatch) entries(app string) []LogEntry {
	if b.skipped == 0 {
		return b.lines
	}
	skip := LogEntry{T: b.lines[0].T, App: app, Stream: "skip",
		Line: fmt.Sprintf("… %d lines not shown (see deployd logs %s)", b.skipped, app)}
	return append([]LogEntry{skip}, b.lines...)
}

func (h *hub) addLine(l LogEntry) {
	b := h.pending[l.App]
	if b == nil {
		b = &lineBatch{}
		h.pending[l.App] = b
	}
	b.add(l)
}

// flushLogs sends each app's batch since the last flush to the pages and
// adds it to the app's tail. One message per app: a message is at most
// one app's batch, so a page's byte bound always holds a whole one.
func (h *hub) flushLogs() {
	for app, b := range h.pending {
		ls := b.entries(app)
		for _, l := range ls {
			h.logs[app] = appendTail(h.logs[app], l, h.opts.LogLines)
		}
		h.broadcast(frame("logs", ls))
	}
	clear(h.pending)
}

// appendTail appends l to an app's tail and keeps its last n lines within
// maxTailBytes (the last line always).
func appendTail(s []LogEntry, l LogEntry, n int) []LogEntry {
	s = appendBounded(s, l, n)
	size := 0
	for i := len(s) - 1; i >= 0; i-- {
		if size += len(s[i].Line); size > maxTailBytes && i < len(s)-1 {
			return s[i+1:]
		}
	}
	return s
}
