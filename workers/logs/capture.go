package logs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"
)

// Capture reads r (the read end of a worker's stdout or stderr pipe) until
// EOF and calls fn with each line, without its "\n" or "\r\n". A line longer
// than maxLine bytes (DefaultMaxLine when maxLine <= 0) is delivered as
// several chunks of at most maxLine bytes, cut at a UTF-8 rune boundary when
// there is one near, whose concatenation is the line. A last line without a
// newline is delivered too. It returns nil at EOF and the read error
// otherwise, after delivering what it had read.
//
// fn runs on Capture's goroutine and should not block (Sink.Write does not):
// while fn runs, nobody reads the pipe, and a worker writing to a full pipe
// blocks.
func Capture(r io.Reader, maxLine int, fn func(text string)) error {
	_, err := CaptureFrom(r, nil, maxLine, fn)
	return err
}

// CaptureFrom is Capture starting with pending, the start of a line read
// before (by the previous agent, across a handoff). On a read deadline
// (os.ErrDeadlineExceeded: the agent pauses its readers for a handoff) it
// returns the partial line it holds instead of delivering it, so that
// whoever reads next continues the line: no line is cut, lost or repeated.
func CaptureFrom(r io.Reader, pending []byte, maxLine int, fn func(text string)) ([]byte, error) {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	// Room for a whole line plus "\r\n", so a line of exactly maxLine bytes
	// is recognised as one line and not as a chunk and an empty line. The
	// buffer starts small (a quiet worker's reader holds 4 KiB, not 64),
	// doubles up to that when a line or a burst fills it, and goes back to
	// 4 KiB once a short read leaves no partial line.
	limit := max(maxLine+2, 32<<10)
	buf := make([]byte, max(min(captureStart, limit), len(pending)+1))
	start, end := 0, copy(buf, pending)
	filled := false // the last read filled the buffer: more is waiting
	for {
		if start > 0 { // move the start of a partial line to the front
			end = copy(buf, buf[start:end])
			start = 0
		}
		if (filled || end == len(buf)) && len(buf) < limit {
			buf = append(buf, make([]byte, min(len(buf), limit-len(buf)))...)
		}
		n, err := r.Read(buf[end:])
		end += n
		filled = n > 0 && end == len(buf)
		paused := errors.Is(err, os.ErrDeadlineExceeded)
		start = deliver(buf[start:end], start, maxLine, err != nil && !paused, fn)
		if paused {
			return bytes.Clone(buf[start:end]), err
		}
		if start == end && len(buf) > captureStart && n < captureStart/2 {
			buf, start, end = make([]byte, captureStart), 0, 0 // the burst is over
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, fmt.Errorf("logs: capture: %w", err)
		}
	}
}

// deliver calls fn with every complete line (and chunk of an over-long line)
// in p, and with everything left if final. It returns the new start offset
// (offset is p's start in the buffer).
func deliver(p []byte, offset, maxLine int, final bool, fn func(string)) int {
	for {
		text, n, ok := nextLine(p, maxLine, final)
		if !ok {
			return offset
		}
		fn(string(text))
		p, offset = p[n:], offset+n
	}
}

// linesEnd is where the first k lines of p end, cut as deliver cuts them
// (p holds at least k: it is what deliver gave a recorded append).
func linesEnd(p []byte, maxLine, k int) int {
	off := 0
	for ; k > 0; k-- {
		_, n, ok := nextLine(p[off:], maxLine, false)
		if !ok {
			break
		}
		off += n
	}
	return off
}

// nextLine is the first complete line of p (or chunk of an over-long one),
// without its "\n" or "\r\n", and how many bytes of p it takes; ok is false
// when p holds none (when final, whatever is left is one).
func nextLine(p []byte, maxLine int, final bool) (text []byte, n int, ok bool) {
	if len(p) == 0 {
		return nil, 0, false
	}
	if i := bytes.IndexByte(p, '\n'); i >= 0 {
		e := i
		if e > 0 && p[e-1] == '\r' {
			e--
		}
		if e <= maxLine {
			return p[:e], i + 1, true
		}
	} else if len(p) <= maxLine+1 && !final {
		return nil, 0, false // the line may still end within maxLine: wait for more
	} else if len(p) <= maxLine {
		return p, len(p), true // last line, no newline
	}
	cut := chunkEnd(p, maxLine)
	return p[:cut], cut, true
}

// chunkEnd is where to cut p (longer than maxLine) so as not to split a
// UTF-8 sequence, if one starts within the last few bytes before maxLine.
func chunkEnd(p []byte, maxLine int) int {
	for cut := maxLine; cut > maxLine-utf8.UTFMax && cut > 0; cut-- {
		if utf8.RuneStart(p[cut]) {
			return cut
		}
	}
	return maxLine
}

// captureStart is the size of a new Capture's buffer.
const captureStart = 4 << 10

// Tail keeps the last lines added, e.g. a worker's last output to show when
// it crashes. It is safe for concurrent use.
type Tail struct {
	mu    sync.Mutex
	lines []string // ring; next is the oldest once full
	next  int
	full  bool
}

// NewTail returns a Tail that keeps the last n lines (at least 1).
func NewTail(n int) *Tail {
	return &Tail{lines: make([]string, max(n, 1))}
}

// Add appends s, forgetting the oldest line if the Tail is full.
func (t *Tail) Add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines[t.next] = s
	t.next++
	if t.next == len(t.lines) {
		t.next, t.full = 0, true
	}
}

// Lines returns a copy of the kept lines, oldest first.
func (t *Tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.full {
		return append([]string(nil), t.lines[:t.next]...)
	}
	out := make([]string, 0, len(t.lines))
	out = append(out, t.lines[t.next:]...)
	return append(out, t.lines[:t.next]...)
}
