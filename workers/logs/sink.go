// Package logs captures worker output and writes it to rotating files, losing
// as little as possible and never holding a worker because the disk is slow or
// full: lines wait in a bounded queue; while the writer keeps up with the disk
// a burst waits briefly for room (backpressure, at most stallTimeout), and
// what does not fit when the disk fails or stalls is counted and reported in
// the file once writing works again, and rotation renames files instead of
// copying and truncating them, so nothing written during a rotation is lost.
// A worker's output pipe is read through a Journal (CaptureJournaled), so
// that an agent SIGKILL neither loses nor repeats a line: its lines are
// written at once, recorded in the journal, and the queue is used only while
// writing fails or stalls. It also reads the files back for `deployd logs`
// (StreamLast, Follow).
package logs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ErrClosed is returned by the methods of a closed Sink.
var ErrClosed = errors.New("logs: sink closed")

// Defaults of Options.
const (
	DefaultBufferLines = 10000
	DefaultBufferBytes = 8 << 20
	DefaultMaxSize     = 100 << 20
	// DefaultMaxLine is the longest line Capture delivers whole; longer lines
	// are split into chunks of at most this many bytes.
	DefaultMaxLine = 64 << 10
)

// drainTimeout bounds how long Close keeps writing what is still queued.
const drainTimeout = 2 * time.Second

// agentPID is the pid written in the Sink's own marker lines.
var agentPID = os.Getpid()

// Line is one line of a worker's output.
type Line struct {
	Time    time.Time // when it was read; zero means when Write is called
	App     string
	Slot    int
	PID     int
	Stream  string // "out" or "err"
	Text    string // without the newline
	Release string // the worker's release, "" for none
}

// Options configure a Sink.
type Options struct {
	Path   string // the current file, e.g. log_dir/web.out.log
	Format string // FormatText (default), FormatRaw, FormatJSON or FormatPM2JSON
	// Target is TargetFiles (default, ""), TargetJournal: every line an
	// entry of the systemd journal (Format then does not apply), or
	// TargetBoth: the files, and a twin Sink for the journal beside them.
	Target string

	MaxSize  int64         // rotate when the file would grow past this many bytes; 0 means DefaultMaxSize
	MaxFiles int           // rotated files kept, newest first; 0 keeps all
	MaxAge   time.Duration // rotated files older than this are removed; 0 keeps all
	Compress bool          // gzip rotated files (in the background)

	BufferLines int // lines queued before Write drops; 0 means DefaultBufferLines
	BufferBytes int // bytes of text queued before Write drops; 0 means DefaultBufferBytes

	Logger hclog.Logger // for write errors and recoveries; nil discards

	// Open opens the file end; nil means the default, which rotates by rename.
	// Tests use it to simulate a full or slow disk.
	Open func(Options) (File, error)
}

// Sink writes the lines of one log file. Lines go into a bounded queue that a
// single goroutine, which owns the File, writes out; Write waits at most
// stallTimeout for room, and not at all while the disk fails or stalls.
// All methods are safe for concurrent use.
type Sink struct {
	opts  Options
	queue *lineQueue    // at most BufferLines lines
	reqs  chan request  // to the writer goroutine
	done  chan struct{} // closed when the writer goroutine returns

	queuedBytes atomic.Int64  // text bytes in lines
	dropped     atomic.Uint64 // every line dropped, for Dropped
	overflow    atomic.Uint64 // lines dropped by Write, not yet in a marker

	// Backpressure: while the writer works, Write waits (up to stallTimeout)
	// for room rather than dropping; it drops at once when the last write
	// failed or the writer has been stuck in a write for stallTimeout.
	failing   atomic.Bool
	busySince atomic.Int64                  // UnixNano when the current write started or last moved on; 0: none
	room      atomic.Pointer[chan struct{}] // closed (and replaced) when the writer took lines

	mu     sync.RWMutex // Write holds it shared while it enqueues; Close exclusively
	closed bool

	// twin, for TargetBoth, is the Sink of the journal beside this one's
	// files: Write, Flush, Dropped and Close reach it too, and a journaled
	// capture writes each batch to both, each in its own lane of the
	// worker's journal (Journal). Set by OpenSink and Reconfigure.
	twin     atomic.Pointer[Sink]
	reconf   sync.Mutex  // one Reconfigure at a time
	journald atomic.Bool // the writer's File is the journal's (writer.setFile)

	closeOnce sync.Once
	closeErr  error
}

type reqKind int

const (
	reqFlush reqKind = iota
	reqRotate
	reqTruncate
	reqClose
	reqReopen
	reqAppend  // write lines of a journal now, recording the append in it
	reqResolve // settle the append a journal recorded before a crash
)

// request asks the writer goroutine to write everything queued, then act.
type request struct {
	kind  reqKind
	reply chan error // buffered, so the writer never waits for the asker
	opts  *Options   // reqReopen: the new settings

	journal *Journal // reqAppend, reqResolve
	lane    int      // reqAppend: the journal's lane of this Sink
	lines   []Line   // reqAppend
	upto    int64    // reqAppend: the journal's done offset after the lines
	rec     *Append  // reqResolve
	found   chan Found
}

// OpenSink opens (creating, with its directory) the file at o.Path and starts
// the goroutine that writes it. Close stops it.
func OpenSink(o Options) (*Sink, error) {
	if o.Path == "" {
		return nil, errors.New("logs: open sink: no path")
	}
	if o.Target == TargetBoth {
		return openBoth(o)
	}
	if err := o.settle(); err != nil {
		return nil, fmt.Errorf("logs: open sink %s: %w", o.Path, err)
	}
	if o.MaxSize <= 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.BufferLines <= 0 {
		o.BufferLines = DefaultBufferLines
	}
	if o.BufferBytes <= 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	f, err := o.Open(o)
	if err != nil {
		return nil, fmt.Errorf("logs: open sink %s: %w", o.Path, err)
	}
	s := &Sink{
		opts:  o,
		queue: newLineQueue(o.BufferLines),
		reqs:  make(chan request),
		done:  make(chan struct{}),
	}
	room := make(chan struct{})
	s.room.Store(&room)
	w := &writer{s: s, log: o.Logger.With("path", o.Path), opts: o}
	w.setFile(f)
	go w.run()
	return s, nil
}

// Write queues l. When the queue is full (BufferLines or BufferBytes) it
// waits for room while the writer is making progress, up to stallTimeout;
// when the last write failed, the writer has been stuck in one write for
// stallTimeout, or the Sink is closed, l is dropped and counted at once. Lines that
// cannot be written (a full disk) are dropped and counted too. The next
// successful write starts with a marker line, in the Sink's format:
//
//	2026-11-30T03:22:48.123Z [deployd] deployd: dropped 1234 lines (write error: no space left on device)
//
// (in json: stream "deployd", slot -1 and the agent's pid). The reason is
// "buffer full", "write error: ..." or "closing", or several of them.
// With a twin (TargetBoth), l goes to the twin's journal too.
func (s *Sink) Write(l Line) {
	if l.Time.IsZero() {
		l.Time = time.Now()
	}
	s.write(l)
	if t := s.twin.Load(); t != nil {
		t.write(l)
	}
}

// write is Write to this Sink alone.
func (s *Sink) write(l Line) {
	n := int64(len(l.Text))
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped.Add(1)
		return
	}
	var timer *time.Timer
	for {
		room := s.room.Load()
		if s.queuedBytes.Add(n) <= int64(s.opts.BufferBytes) && s.queue.push(l) {
			if timer != nil {
				timer.Stop()
			}
			return
		}
		s.queuedBytes.Add(-n)
		if s.failing.Load() || s.stuck() {
			s.drop()
			return
		}
		if timer == nil {
			timer = time.NewTimer(stallTimeout)
		}
		select {
		case <-*room:
		case <-timer.C:
			s.drop()
			return
		case <-s.done:
			s.drop()
			return
		}
	}
}

// stallTimeout is how long Write waits for room while the writer works,
// and how long a write may go without moving on before it is taken for
// stalled (the journal's write of a batch moves on an entry at a time).
const stallTimeout = 500 * time.Millisecond

func (s *Sink) stuck() bool {
	t := s.busySince.Load()
	return t != 0 && time.Since(time.Unix(0, t)) > stallTimeout
}

func (s *Sink) drop() {
	s.dropped.Add(1)
	s.overflow.Add(1)
}

// appendJournaled writes lines (of j's stream, up to j's offset upto, in
// j's lane lane) to this Sink alone, now, after what is queued, and returns once they are written (or dropped and
// counted: a full disk); the Sink records the append in j just before the
// write (Journal). While writing fails or stalls it queues them as Write
// does: a disk that stalls or fails holds no worker, and exactly-once then
// holds only as long as the agent lives.
func (s *Sink) appendJournaled(j *Journal, lane int, lines []Line, upto int64) {
	if s.failing.Load() || s.stuck() {
		for _, l := range lines {
			s.write(l)
		}
		return
	}
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		s.dropped.Add(uint64(len(lines)))
		return
	}
	r := request{kind: reqAppend, journal: j, lane: lane, lines: lines, upto: upto, reply: make(chan error, 1)}
	select {
	case s.reqs <- r:
		<-r.reply
	case <-s.done:
		s.dropped.Add(uint64(len(lines)))
	}
}

// Resolve tells how much of the append rec (recorded in a journal by an
// agent that died before it marked it done) is in the log: what is not
// must be written again. A write the dying agent left torn at the end of
// the current file is cut off first.
func (s *Sink) Resolve(rec *Append) Found {
	r := request{kind: reqResolve, rec: rec, found: make(chan Found, 1)}
	select {
	case s.reqs <- r:
		return <-r.found
	case <-s.done:
		return Found{}
	}
}

// Dropped returns how many lines were dropped since the Sink was opened:
// because the queue was full, because writing them failed, or because Close
// ran out of time. With a twin, its drops are added: a line dropped by
// both counts twice.
func (s *Sink) Dropped() uint64 {
	n := s.dropped.Load()
	if t := s.twin.Load(); t != nil {
		n += t.dropped.Load()
	}
	return n
}

// Flush waits until every line queued before the call is written (with a
// twin, into both places), or ctx is done. It returns the write error if
// some of them could not be written.
func (s *Sink) Flush(ctx context.Context) error {
	err := s.do(ctx, reqFlush, "flush")
	if t := s.twin.Load(); t != nil {
		err = errors.Join(err, t.do(ctx, reqFlush, "flush"))
	}
	return err
}

// Rotate writes what is queued, then renames the current file aside and
// starts a new one (SIGUSR1, `deployd logs --rotate`).
func (s *Sink) Rotate() error {
	return s.do(context.Background(), reqRotate, "rotate")
}

// Truncate writes what is queued, then empties the current file and removes
// the rotated ones (`deployd logs --flush`).
func (s *Sink) Truncate() error {
	return s.do(context.Background(), reqTruncate, "truncate")
}

// reconfigure is Reconfigure of this Sink alone.
func (s *Sink) reconfigure(o Options) error {
	if o.Open == nil && (o.Target == s.opts.Target || o.Target == "" && s.opts.Target == TargetFiles) {
		o.Open = s.opts.Open // the same target's File (a test's stays)
	}
	if err := o.settle(); err != nil {
		return fmt.Errorf("logs: reconfigure %s: %w", s.opts.Path, err)
	}
	if o.MaxSize <= 0 {
		o.MaxSize = DefaultMaxSize
	}
	n := s.opts // the writer's copy changes; s.opts is read by Write and stays
	n.Target, n.Open = o.Target, o.Open
	n.Format, n.MaxSize, n.MaxFiles, n.MaxAge, n.Compress = o.Format, o.MaxSize, o.MaxFiles, o.MaxAge, o.Compress
	return s.doWith(context.Background(), request{kind: reqReopen, opts: &n}, "reconfigure")
}

// Targets of a Sink (Options.Target).
const (
	TargetFiles   = "files"
	TargetJournal = "journal"
	TargetBoth    = "both"
)

// settle checks o's Format and Target and fills in their defaults and the
// File that goes with the Target.
func (o *Options) settle() error {
	switch o.Target {
	case "", TargetFiles:
		o.Target = TargetFiles
		if o.Open == nil {
			o.Open = newRotator
		}
	case TargetJournal:
		o.Format = formatJournald
		if o.Open == nil {
			o.Open = newJournald
		}
		return nil
	default:
		return fmt.Errorf("unknown target %q", o.Target)
	}
	if o.Format == "" {
		o.Format = FormatText
	}
	if !validFormat(o.Format) {
		return fmt.Errorf("unknown format %q", o.Format)
	}
	return nil
}

func (s *Sink) do(ctx context.Context, kind reqKind, what string) error {
	return s.doWith(ctx, request{kind: kind}, what)
}

func (s *Sink) doWith(ctx context.Context, r request, what string) error {
	r.reply = make(chan error, 1)
	select {
	case s.reqs <- r:
	case <-s.done:
		return fmt.Errorf("logs: %s %s: %w", what, s.opts.Path, ErrClosed)
	case <-ctx.Done():
		return fmt.Errorf("logs: %s %s: %w", what, s.opts.Path, ctx.Err())
	}
	select {
	case err := <-r.reply:
		if err != nil {
			return fmt.Errorf("logs: %s %s: %w", what, s.opts.Path, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("logs: %s %s: %w", what, s.opts.Path, ctx.Err())
	}
}

// Close refuses new lines, writes what is queued (for at most a couple of
// seconds; the rest is counted as dropped), closes the file and waits for the
// writer goroutine. It is safe to call twice; later calls return the first
// call's result.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		if t := s.twin.Load(); t != nil {
			s.closeErr = t.Close()
		}
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		r := request{kind: reqClose, reply: make(chan error, 1)}
		s.reqs <- r
		if err := <-r.reply; err != nil {
			s.closeErr = errors.Join(s.closeErr, fmt.Errorf("logs: close %s: %w", s.opts.Path, err))
		}
		<-s.done
	})
	return s.closeErr
}
