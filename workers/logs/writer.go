package logs

import (
	"bytes"
	"errors"
	"io/fs"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// batchBytes is how much formatted output the writer collects before a write.
const batchBytes = 256 << 10

// writer is a Sink's writer goroutine and its state, all owned by run: the
// File, the batch being built and the accounting of dropped lines.
type writer struct {
	s    *Sink
	f    File
	log  hclog.Logger
	opts Options // the file's settings: s.opts, or the last Reconfigure's

	buf     []byte // formatted lines not yet written
	head    []byte // scratch for a marker written before buf
	app     string // app of the last line, for the marker
	pending uint64 // dropped lines no marker has reported yet
	full    bool   // some of pending were dropped because the queue was full
	closing bool   // some of pending were dropped because Close ran out of time
	werr    error  // the write error that dropped some of pending
	broken  bool   // the file ends in a partial line (a write failed midway)

	journal *Journal // records the next flush (appendJournaled)
	lane    int      // in this lane of journal
	upto    int64    // journal's done offset once that flush is written
}

func (w *writer) run() {
	defer close(w.s.done)
	idle := time.NewTimer(idleTrim)
	defer idle.Stop()
	for {
		select {
		case <-w.s.queue.ready:
			w.take() // at most BufferLines, so requests are not starved
			w.flush()
			w.signalRoom()
			idle.Reset(idleTrim)
		case <-idle.C:
			w.trim()
		case r := <-w.s.reqs:
			if r.kind == reqClose {
				r.reply <- w.close()
				return
			}
			if r.kind == reqAppend {
				r.reply <- w.appendJournaled(r)
				continue
			}
			if r.kind == reqResolve {
				r.found <- w.resolve(r.rec)
				continue
			}
			if r.kind == reqReopen {
				r.reply <- w.reopen(*r.opts)
				continue
			}
			r.reply <- w.handle(r.kind)
		}
	}
}

// idleTrim is how long a sink without new lines keeps the memory a burst
// grew (its queue's arrays, the batch buffer) before it lets it go.
const idleTrim = 2 * time.Second

// keepBuf is the batch buffer's capacity an idle writer keeps.
const keepBuf = 16 << 10

// trim lets go of what a burst grew, once the sink is idle, and then
// returns the burst's garbage (a string per line) to the OS: the agent
// allocates little between bursts, so without a collection now the pages
// would stay resident until the runtime's periodic GC, minutes later.
func (w *writer) trim() {
	big := w.s.queue.trim() || cap(w.buf) > keepBuf || cap(w.head) > keepBuf
	if cap(w.buf) > keepBuf {
		w.buf = nil
	}
	if cap(w.head) > keepBuf {
		w.head = nil
	}
	if big {
		releaseMemory()
	}
}

// lastRelease is when releaseMemory last ran (UnixNano), shared by every
// sink of the process.
var lastRelease atomic.Int64

// releaseMemory runs a GC and returns free memory to the OS, at most once
// per releaseEvery for the whole process: a GC of the agent's small heap
// takes about a millisecond.
func releaseMemory() {
	now, last := time.Now().UnixNano(), lastRelease.Load()
	if now-last < int64(releaseEvery) || !lastRelease.CompareAndSwap(last, now) {
		return
	}
	debug.FreeOSMemory()
}

const releaseEvery = 10 * time.Second

// handle writes the lines queued before the request arrived, then acts on it.
func (w *writer) handle(kind reqKind) error {
	err := w.take()
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	switch kind {
	case reqRotate:
		return w.f.Rotate()
	case reqTruncate:
		return w.f.Truncate()
	}
	return err
}

// reopen writes what is queued in the old format, closes the file and
// opens it again with o; if that fails it goes on with the old settings.
func (w *writer) reopen(o Options) error {
	_ = w.take()
	_ = w.flush()
	if err := w.f.Close(); err != nil {
		w.log.Warn("close the log to reconfigure it", "error", err)
	}
	f, err := o.Open(o)
	if err != nil {
		if f, err2 := w.opts.Open(w.opts); err2 == nil {
			w.setFile(f)
		} else {
			w.f = failedFile{err2}
		}
		return err
	}
	w.setFile(f)
	w.opts = o
	return nil
}

// setFile makes f the writer's File. The journal sends a batch an entry at
// a time, for as long as a second or more: it tells each step to the Sink
// (busySince), so that a write that moves on is not taken for a stalled
// one, whose lines Write and appendJournaled only queue.
func (w *writer) setFile(f File) {
	jd, ok := f.(*journald)
	if ok {
		jd.progress = &w.s.busySince
	}
	w.s.journald.Store(ok)
	w.f = f
}

// failedFile stands for a log file that could not be opened again: every
// write fails (and is counted as dropped) until the next Reconfigure.
type failedFile struct{ err error }

func (f failedFile) Write([]byte) (int, error) { return 0, f.err }
func (f failedFile) Rotate() error             { return f.err }
func (f failedFile) Truncate() error           { return f.err }
func (f failedFile) Close() error              { return nil }

// take formats the queued lines without waiting for more, writing whenever
// a batch is full. It returns the first write error.
func (w *writer) take() error {
	var first error
	lines := w.s.queue.take()
	for i := range lines {
		if err := w.add(&lines[i]); first == nil {
			first = err
		}
	}
	w.s.queue.done(lines)
	return first
}

func (w *writer) add(l *Line) error {
	w.s.queuedBytes.Add(-int64(len(l.Text)))
	w.app = l.App
	w.buf = appendLine(w.buf, w.opts.Format, l)
	if len(w.buf) >= batchBytes {
		return w.flush()
	}
	return nil
}

// flush writes the batch, preceded by a marker line if lines were dropped
// since the last successful write. On error the lines that did not make it
// are counted as dropped; the next write tries again.
func (w *writer) flush() error {
	if n := w.s.overflow.Swap(0); n > 0 {
		w.pending += n
		w.full = true
	}
	if len(w.buf) == 0 && w.pending == 0 {
		return nil
	}
	data := w.buf
	head := 0
	if w.pending > 0 || w.broken {
		w.head = w.head[:0]
		if w.broken {
			w.head = append(w.head, '\n') // end the partial line
		}
		if w.pending > 0 {
			m := markerLine(time.Now(), w.app, w.pending, w.reason())
			w.head = appendLine(w.head, w.opts.Format, &m)
		}
		head = len(w.head)
		w.head = append(w.head, w.buf...)
		data = w.head
	}
	w.s.busySince.Store(time.Now().UnixNano())
	var n int
	var err error
	if w.journal != nil {
		n, err = w.writeRecorded(data)
	} else {
		n, err = w.f.Write(data)
	}
	w.s.busySince.Store(0)
	w.s.failing.Store(err != nil)
	w.buf = w.buf[:0]
	if err == nil {
		if w.werr != nil {
			w.log.Info("writing the log works again", "dropped", w.pending)
		}
		w.pending, w.full, w.closing, w.werr, w.broken = 0, false, false, nil, false
		return nil
	}
	if w.werr == nil {
		w.log.Error("cannot write the log; dropping lines until it works", "error", err)
	}
	if n >= head { // the marker made it
		w.pending, w.full, w.closing = 0, false, false
	}
	lost := uint64(bytes.Count(data[max(n, head):], []byte{'\n'}))
	w.pending += lost
	w.s.dropped.Add(lost)
	w.werr = err
	if n > 0 {
		w.broken = data[n-1] != '\n'
	}
	return err
}

// reason says why the lines in pending were dropped, for the marker.
func (w *writer) reason() string {
	var r []string
	if w.full {
		r = append(r, "buffer full")
	}
	if w.werr != nil {
		r = append(r, "write error: "+errText(w.werr))
	}
	if w.closing {
		r = append(r, "closing")
	}
	return strings.Join(r, ", ")
}

// errText is the bare cause of a write error: "no space left on device",
// without the path and the wrapping.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// close writes what is queued, for at most drainTimeout, counts the rest as
// dropped (Write refuses new lines by now), tries to leave a marker for them
// and closes the File.
func (w *writer) close() error {
	deadline := time.Now().Add(drainTimeout)
	var left uint64
	for lines := w.s.queue.take(); len(lines) > 0; lines = w.s.queue.take() {
		for i := range lines {
			if left == 0 && (i%batchLines != 0 || time.Now().Before(deadline)) {
				w.add(&lines[i])
				continue
			}
			w.s.queuedBytes.Add(-int64(len(lines[i].Text)))
			left++
		}
		w.s.queue.done(lines)
	}
	if left > 0 {
		w.s.dropped.Add(left)
		w.pending += left
		w.closing = true
	}
	w.flush()
	return w.f.Close()
}

// batchLines is how many lines close writes between looks at the clock.
const batchLines = 1024

// signalRoom wakes the Writes waiting for room in the queue.
func (w *writer) signalRoom() {
	room := make(chan struct{})
	close(*w.s.room.Swap(&room))
}
