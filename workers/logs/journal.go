package logs

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A Journal holds the bytes of one output stream of a worker between its
// pipe and the log file, in a memfd that the worker keeps a copy of (as it
// keeps its pipes' read ends), so that they outlive an agent SIGKILL:
//
//   - Bytes leave the pipe only by splice(2) into the journal: each byte is
//     either still in the pipe or in the journal, never in neither (a read
//     into the agent's memory would be lost with the agent).
//   - Before the complete lines among them are written to the log file, the
//     journal's header records the append: the file (device, inode), the
//     offset it starts at, its length and its SHA-256, and up to where in
//     the journal it goes. After the write, the header says those bytes are
//     done.
//   - The agent that comes after a crash (Sink.Resolve) looks for a recorded
//     append in the file: the bytes there hash alike, it happened (the
//     journal's bytes are done); otherwise it did not, and they are written
//     now. So a line is neither lost nor written twice.
//
// The header is one pwrite within the memfd's first page, which a SIGKILL
// cannot tear. A Journal is used by one reader goroutine at a time; its
// header is written under mu because the Sink's writer records the append.
//
// A stream logged to two places (target = "both": the files and the
// systemd journal) has a lane per place, each with its own done offset and
// recorded append, written in the same pwrite: a line is written to the
// files, marked done in their lane, then sent to the journal and marked
// done in its lane. An agent killed between the two leaves one lane
// behind; the next agent settles each lane's append with its own place
// and gives the lane behind the lines the other has, so each place gets
// every line once.
type Journal struct {
	f *os.File

	mu      sync.Mutex
	lanes   [maxLanes]lane
	n       int   // lanes in use: 1, or 2 for a Sink with a twin
	end     int64 // journal offset after the last byte spliced in
	punched int64 // the pages before it were given back
	pending []byte
	pbase   int64 // the journal offset of pending[0]: the lowest done
}

// lane is the progress of one place a stream's lines go to.
type lane struct {
	done int64   // journal offset up to which the bytes are in that place
	rec  *Append // the append being made, or the one a dead agent was making, until settled
}

// maxLanes is how many places a stream's lines go to at most.
const maxLanes = 2

// Append is an append of a journal's bytes to a log file, as recorded
// before it is written.
type Append struct {
	Dev, Ino uint64
	Off, Len int64
	Sum      [sha256.Size]byte
	Upto     int64 // the journal's done offset once the append happened
}

const (
	journalMagic = 0x444a4c31 // "DJL1": lane 0, as every agent with journals writes it
	laneMagic    = 0x444a4c32 // "DJL2": lane 1, beside lane 0
	journalData  = 4096       // the data starts after the header's page
	blockSize    = 4 + 8 + 1 + 8 + 8 + 8 + 8 + sha256.Size + 8
	// lane1Off is where lane 1's block starts: past lane 0's, which an
	// agent older than lanes writes alone (it leaves the rest of the page
	// as it is). Lane 1's block ends with the lane 0 done it was written
	// with: when lane 0's differs, an older agent moved lane 0 on since
	// (a failed upgrade), and lane 1 is stale.
	lane1Off   = 128
	headerSize = lane1Off + blockSize + 8
	spliceMax  = 64 << 10 // bytes moved from the pipe per splice
	// maxJournal bounds what a journal taken from a worker may hold
	// unwritten: a dead agent moved at most spliceMax past a partial line.
	maxJournal = 4 << 20
)

// NewJournal creates an empty journal.
func NewJournal(name string) (*Journal, error) {
	fd, err := unix.MemfdCreate("deployd-journal-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("logs: journal: memfd_create: %w", err)
	}
	j := &Journal{f: os.NewFile(uintptr(fd), "journal-"+name)}
	j.reset()
	if err := j.writeHeader(); err != nil {
		j.f.Close()
		return nil, err
	}
	return j, nil
}

// reset makes j empty, with one lane.
func (j *Journal) reset() {
	j.lanes, j.n = [maxLanes]lane{{done: journalData}}, 1
	j.end, j.punched, j.pending, j.pbase = journalData, journalData, nil, journalData
}

// OpenJournal takes the journal in f (copied from a worker after a crash,
// or passed by a handoff): the bytes not yet done and the append the agent
// that wrote it may have been making, which the first capture settles with
// its Sink. f is owned by the Journal. A journal whose header makes no
// sense is started afresh on the same file, and the error says so: what it
// held is lost.
func OpenJournal(f *os.File) (*Journal, error) {
	// Only a journal is ever written: the fd a worker kept may have been
	// closed and reused by the app for a file of its own.
	if name, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); !strings.HasPrefix(name, "/memfd:deployd-journal-") {
		return nil, fmt.Errorf("logs: journal: %q is not a deployd journal", name)
	}
	j := &Journal{f: f}
	j.reset()
	if err := j.load(); err != nil {
		j.reset()
		if terr := f.Truncate(journalData); terr != nil {
			return nil, errors.Join(err, terr)
		}
		if herr := j.writeHeader(); herr != nil {
			return nil, errors.Join(err, herr)
		}
		return j, err
	}
	return j, nil
}

// load reads the header and the bytes not done from the memfd: another
// agent may have used it since this one last did (a handoff that failed
// after the next agent read on).
func (j *Journal) load() error {
	var h [headerSize]byte
	if _, err := j.f.ReadAt(h[:], 0); err != nil {
		return fmt.Errorf("logs: journal: header: %w", err)
	}
	if binary.LittleEndian.Uint32(h[0:]) != journalMagic {
		return errors.New("logs: journal: not a deployd journal")
	}
	st, err := j.f.Stat()
	if err != nil {
		return fmt.Errorf("logs: journal: %w", err)
	}
	end := max(st.Size(), journalData)
	lanes, n := [maxLanes]lane{readBlock(h[0:])}, 1
	b1 := h[lane1Off:]
	if binary.LittleEndian.Uint32(b1) == laneMagic && int64(binary.LittleEndian.Uint64(b1[blockSize:])) == lanes[0].done {
		lanes[1], n = readBlock(b1), 2
	}
	base := lanes[0].done
	for _, l := range lanes[:n] {
		if l.done < journalData || l.done > end || (l.rec != nil && (l.rec.Upto < l.done || l.rec.Upto > end)) {
			return fmt.Errorf("logs: journal: inconsistent header (done %d, end %d)", l.done, end)
		}
		base = min(base, l.done)
	}
	if end-base > maxJournal {
		return fmt.Errorf("logs: journal: inconsistent header (done %d, end %d)", base, end)
	}
	pending := make([]byte, end-base)
	if _, err := j.f.ReadAt(pending, base); err != nil {
		return fmt.Errorf("logs: journal: %w", err)
	}
	j.lanes, j.n, j.end, j.pending, j.pbase = lanes, n, end, pending, base
	j.punched = max(j.punched, base-base%journalData)
	return nil
}

// File is the memfd, for the worker to keep and a handoff to pass.
func (j *Journal) File() *os.File { return j.f }

// Close closes the memfd (the agent's copy).
func (j *Journal) Close() error { return j.f.Close() }

// writeHeader writes every lane's done offset and recorded append, in one
// pwrite. Called with mu held, or before the Journal is shared.
func (j *Journal) writeHeader() error {
	var h [headerSize]byte
	putBlock(h[0:], journalMagic, j.lanes[0])
	if j.n > 1 {
		putBlock(h[lane1Off:], laneMagic, j.lanes[1])
		binary.LittleEndian.PutUint64(h[lane1Off+blockSize:], uint64(j.lanes[0].done))
	}
	if _, err := j.f.WriteAt(h[:], 0); err != nil {
		return fmt.Errorf("logs: journal: header: %w", err)
	}
	return nil
}

// record notes that data, which holds the journal's bytes up to upto, is
// about to be appended at pos, the place of lane i.
func (j *Journal) record(i int, pos FilePos, data []byte, upto int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lanes[i].rec = &Append{Dev: pos.Dev, Ino: pos.Ino, Off: pos.Size, Len: int64(len(data)),
		Sum: sha256.Sum256(data), Upto: upto}
	return j.writeHeader()
}

// commit notes that the journal's bytes up to upto are in lane i's place
// (or were dropped, and counted), and gives back the memory of the pages
// every lane is done with.
func (j *Journal) commit(i int, upto int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lanes[i] = lane{done: upto}
	err := j.writeHeader()
	done := j.base()
	if page := done - done%journalData; page-j.punched >= punchEvery || (page > j.punched && done == j.end) {
		_ = unix.Fallocate(int(j.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, j.punched, page-j.punched)
		j.punched = page
	}
	return err
}

// punchEvery is how many done bytes a journal keeps before giving their
// pages back while it is not empty.
const punchEvery = 256 << 10

// FilePos is where an append to a log file starts: the file and its size.
type FilePos struct {
	Dev, Ino uint64
	Size     int64
}

// fill moves what the pipe r holds (up to spliceMax) into the journal and
// appends it to pending; it waits for r to be readable, and returns io.EOF
// when r's writers are all gone and it is empty. A read deadline on r ends
// the wait with os.ErrDeadlineExceeded.
func (j *Journal) fill(r *os.File) error {
	raw, err := r.SyscallConn()
	if err != nil {
		return err
	}
	jfd := int(j.f.Fd())
	var n int64
	var serr error
	off := j.end
	err = raw.Read(func(fd uintptr) bool {
		n, serr = unix.Splice(int(fd), nil, jfd, &off, spliceMax, unix.SPLICE_F_NONBLOCK)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err != nil {
		return err
	}
	if serr != nil && !errors.Is(serr, unix.EINTR) {
		return fmt.Errorf("logs: splice into the journal: %w", serr)
	}
	if n == 0 && serr == nil {
		return io.EOF
	}
	if n <= 0 {
		return nil
	}
	start := len(j.pending)
	j.pending = append(j.pending, make([]byte, n)...)
	if _, err := j.f.ReadAt(j.pending[start:], j.end); err != nil {
		j.pending = j.pending[:start]
		return fmt.Errorf("logs: journal: %w", err)
	}
	j.end += n
	return nil
}

// add puts bytes read before (a partial line a previous agent had read into
// its memory and handed over) at the journal's end.
func (j *Journal) add(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if _, err := j.f.WriteAt(p, j.end); err != nil {
		return fmt.Errorf("logs: journal: %w", err)
	}
	j.end += int64(len(p))
	j.pending = append(j.pending, p...)
	return nil
}

// CaptureJournaled is Capture for a worker's output pipe r that has a
// journal: bytes go from r into j, and each batch of complete lines (and
// chunks of over-long ones, as Capture cuts them) is given to fn line by
// line, then written to sink (nil: none; with a twin, to both: each has
// its lane in j) and only then marked done in j.
// No byte is ever held only in the agent's memory, so an agent SIGKILL
// loses nothing and repeats nothing: the next agent settles the append j
// records (Sink.Resolve) and reads on. pending is the start of a line a
// previous agent without journals handed over. A read deadline on r (a
// handoff pauses the reader) returns os.ErrDeadlineExceeded with the
// partial line left in j; calling it again goes on. It returns nil at EOF,
// after the last line.
func CaptureJournaled(r *os.File, j *Journal, pending []byte, sink *Sink, maxLine int, line func(text string) Line, fn func(text string)) error {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	if err := j.Settle(sink); err != nil {
		return err
	}
	if err := j.add(pending); err != nil {
		return err
	}
	for {
		if err := j.deliver(sink.lanes(), maxLine, false, line, fn); err != nil {
			return err
		}
		err := j.fill(r)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if err != nil {
			if derr := j.deliver(sink.lanes(), maxLine, true, line, fn); derr != nil {
				return derr
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("logs: capture: %w", err)
		}
	}
}

// Settle reads j (another agent may have used it) and settles the append
// each lane recorded, if its agent died while making it: found in its
// place (sink's file, or the journal of sink's twin), its bytes are done;
// torn at the file's end, the torn part is cut off and they are written
// again by the capture, as when it is not there at all.
//
// A torn append can be cut off only while it is at its file's end: once
// another stream's lines follow it (another worker's, with the same log
// file), it looks absent, and writing its batch again repeats the torn
// part's lines and glues the cut line to the next one. So the agent that
// adopts workers settles the journals of every worker that writes to a
// Sink before it starts any of their readers. CaptureJournaled settles
// too; for a settled journal that does nothing.
func (j *Journal) Settle(sink *Sink) error {
	if err := j.load(); err != nil {
		return err
	}
	sinks := sink.lanes()
	for i := range j.n {
		if j.lanes[i].rec == nil {
			continue
		}
		if err := j.settle(i, settlerOf(j.lanes[i].rec, sinks, i)); err != nil {
			return err
		}
	}
	err := j.use(len(sinks))
	j.trim()
	return err
}

// settle finds out how much of the append lane i recorded (an agent died
// while it was making it) is in sink's place, and marks that much done:
// all of its bytes, or the lines of those of its entries the journal
// shows. What is not there is written again by the capture, as a new
// append. The header then says what the place holds, so an agent killed
// before that append leaves the next one the same facts (nothing of it in
// memory only).
func (j *Journal) settle(i int, sink *Sink) error {
	l := j.lanes[i]
	var found Found
	if sink != nil {
		found = sink.Resolve(l.rec)
	}
	upto := l.done
	switch batch := j.pending[l.done-j.pbase : l.rec.Upto-j.pbase]; {
	case found.All:
		upto = l.rec.Upto
	case found.Lines > 0:
		// The lines as the capture cut them: CaptureJournaled's maxLine
		// is the default for every worker (workers.capture).
		upto += int64(linesEnd(batch, DefaultMaxLine, found.Lines))
	}
	return j.commit(i, upto)
}

// deliver hands the complete lines of pending (all of it when final) to fn
// and to each lane's sink, then marks them done. A lane behind the others
// (its agent died between two places' writes of a batch) first gets the
// lines the others have, which fn has seen.
func (j *Journal) deliver(sinks []*Sink, maxLine int, final bool, line func(string) Line, fn func(string)) error {
	if err := j.use(len(sinks)); err != nil {
		return err
	}
	top := j.top()
	for i := range j.n {
		done := j.lanes[i].done
		if done == top {
			continue
		}
		var lines []Line
		deliver(j.pending[done-j.pbase:top-j.pbase], 0, maxLine, true, func(s string) { lines = append(lines, line(s)) })
		if sinks[i] != nil {
			sinks[i].appendJournaled(j, i, lines, top)
		}
		if err := j.commit(i, top); err != nil {
			return err
		}
	}
	j.trim()
	var texts []string
	k := deliver(j.pending, 0, maxLine, final, func(s string) { texts = append(texts, s) })
	if k == 0 {
		return nil
	}
	for _, t := range texts {
		fn(t)
	}
	upto := top + int64(k)
	var lines []Line
	for i := range j.n {
		if sinks[i] != nil {
			if lines == nil {
				lines = make([]Line, len(texts))
				for i, t := range texts {
					lines[i] = line(t)
				}
			}
			sinks[i].appendJournaled(j, i, lines, upto)
		}
		if err := j.commit(i, upto); err != nil {
			return err
		}
	}
	j.trim()
	return nil
}
