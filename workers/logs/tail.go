package logs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/deployd/deployd/internal/safeopen"
)

// maxTailLine is the longest line Tail delivers whole; a longer one (no
// Sink writes one: its longest is a DefaultMaxLine text escaped as JSON) is
// delivered in chunks, so that what a caller holds stays bounded.
const maxTailLine = 8 * DefaultMaxLine

// StreamLast calls fn with the last n lines of the log at path, oldest
// first, reading them from the files as fn returns. It finds where they
// start by reading backwards in blocks, then reads forward from there, so
// that it holds one block and one line whatever n and however slowly fn
// takes them. If the current file has fewer than n lines, the rest come
// from the rotated files. The current file is held open meanwhile; the
// lines end at the last newline it had when StreamLast began (a line still
// being written is left to a follow), and Tailed.Follow goes on from
// there without a gap or a line twice; the caller closes what it returns.
// An error from fn stops it and is returned as is. A log with no file at
// all is fs.ErrNotExist.
func StreamLast(path string, n int, fn func(line string) error) (*Tailed, error) {
	return tail(path, n, false, fn)
}

// Tailed is where StreamLast stopped: in the current file, which it holds
// open until Follow or Close.
type Tailed struct {
	Position
	f *os.File // nil: there was no current file
}

// Follow is FollowFrom from where StreamLast stopped, in the file it read
// even if that was rotated since (its rest comes first). It closes t.
func (t *Tailed) Follow(ctx context.Context, path string, fn func(line string)) (Position, error) {
	f := t.f
	t.f = nil
	if f == nil {
		return FollowFrom(ctx, path, 0, fn) // the file that comes, whole
	}
	if _, err := f.Seek(t.Offset, io.SeekStart); err != nil {
		f.Close()
		return Position{}, fmt.Errorf("logs: follow: %w", err)
	}
	return followFrom(ctx, path, f, t.Offset, fn)
}

// Close lets go of the file; safe on nil and twice.
func (t *Tailed) Close() {
	if t != nil && t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// LastLines returns the last n lines of the log at path, oldest first, as
// StreamLast reads them, the current file's last line included even when
// it has no newline yet.
func LastLines(path string, n int) ([]string, error) {
	if n <= 0 {
		return nil, nil
	}
	var lines []string
	t, err := tail(path, n, true, func(l string) error {
		lines = append(lines, l)
		return nil
	})
	t.Close()
	return lines, err
}

// segment is one file's part of a tail: from the start of its first line
// to its end (or, in the current file, to end).
type segment struct {
	f     *os.File // the current file, held open; nil: a rotated file, opened in its turn
	path  string
	gz    bool
	start int64 // bytes skipped (of the uncompressed content)
	skip  int   // then lines skipped (a compressed file, read from its start)
	end   int64 // the current file's end; unused for a rotated one
}

// tail is StreamLast; partial counts the current file's unfinished last
// line.
func tail(path string, n int, partial bool, fn func(string) error) (*Tailed, error) {
	buf := make([]byte, tailBlock)
	var segs []segment
	var pos Position
	var err error
	for range 3 {
		segs, pos, err = planTail(path, n, partial, buf)
		if !errors.Is(err, errRotated) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("logs: last lines of %s: %w", path, err)
	}
	t := &Tailed{Position: pos}
	if len(segs) > 0 {
		t.f = segs[0].f // the current file, or nil
	}
	var fnErr error
	deliver := func(l string) error {
		fnErr = fn(l)
		return fnErr
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if err := segs[i].stream(deliver); err != nil {
			t.Close()
			if fnErr != nil {
				return nil, fnErr
			}
			return nil, fmt.Errorf("logs: last lines of %s: %w", path, err)
		}
	}
	return t, nil
}

// errRotated: the current file was rotated while planTail looked for the
// rotated files.
var errRotated = errors.New("rotated three times while it was being read; ask again")

// planTail finds where the last n lines of the log at path start, newest
// file first, and where they end in the current file (pos).
func planTail(path string, n int, partial bool, buf []byte) (segs []segment, pos Position, err error) {
	defer func() {
		if err != nil {
			for _, s := range segs {
				if s.f != nil {
					s.f.Close()
				}
			}
			segs = nil
		}
	}()
	found := 0
	cur, err := safeopen.Open(path)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return nil, Position{}, err
	}
	var curSt os.FileInfo
	if cur != nil {
		seg, p, k, err := planCurrent(cur, n, partial, buf)
		segs = append(segs, seg) // closed on an error as well
		if err != nil {
			return segs, Position{}, err
		}
		curSt, pos, found = p.st, p.Position, k
	}
	if found >= n {
		return segs, pos, nil
	}
	backups, err := listBackups(path)
	if err != nil {
		return segs, Position{}, err
	}
	if curSt != nil {
		if st, err := os.Lstat(path); err != nil || !os.SameFile(st, curSt) {
			return segs, Position{}, errRotated // then it is among the backups too
		}
	}
	if missing && len(backups) == 0 {
		return nil, Position{}, fs.ErrNotExist
	}
	for _, b := range backups {
		seg, k, err := planRotated(b, n-found, buf)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned meanwhile
		}
		if err != nil {
			return segs, Position{}, err
		}
		segs = append(segs, seg)
		if found += k; found >= n {
			break
		}
	}
	return segs, pos, nil
}

// curPos is where a tail ends in the current file.
type curPos struct {
	Position
	st os.FileInfo
}

// planCurrent plans the tail's part in the current file f: its last n
// lines (k of them) up to its last newline (partial: its end).
func planCurrent(f *os.File, n int, partial bool, buf []byte) (segment, curPos, int, error) {
	seg := segment{f: f}
	st, err := f.Stat()
	if err != nil {
		return seg, curPos{}, 0, err
	}
	end := st.Size()
	if !partial {
		nl, err := lastNewline(f, end, buf)
		if err != nil {
			return seg, curPos{}, 0, err
		}
		end = nl + 1
	}
	start, k, err := lineStart(f, end, n, buf)
	if err != nil {
		return seg, curPos{}, 0, err
	}
	seg.start, seg.end = start, end
	p := curPos{Position: Position{Offset: end}, st: st}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		p.Dev, p.Ino = uint64(sys.Dev), sys.Ino
	}
	return seg, p, k, nil
}

// planRotated plans the tail's part in the rotated file b: its last need
// lines (k of them).
func planRotated(b backup, need int, buf []byte) (segment, int, error) {
	seg := segment{path: b.path, gz: b.gz}
	f, err := safeopen.Open(b.path)
	if errors.Is(err, fs.ErrNotExist) && !b.gz {
		// Compressed meanwhile: the same lines.
		return planRotated(backup{path: b.path + gzSuffix, gz: true}, need, buf)
	}
	if err != nil {
		return seg, 0, err
	}
	defer f.Close()
	if b.gz {
		total, err := countLines(f, buf)
		if err != nil {
			return seg, 0, err
		}
		seg.skip = max(total-need, 0)
		return seg, total - seg.skip, nil
	}
	st, err := f.Stat()
	if err != nil {
		return seg, 0, err
	}
	start, k, err := lineStart(f, st.Size(), need, buf)
	seg.start = start
	return seg, k, err
}

// stream calls fn with the lines of s.
func (s segment) stream(fn func(string) error) error {
	if s.f != nil {
		return streamLines(io.NewSectionReader(s.f, s.start, s.end-s.start), 0, fn)
	}
	gz := s.gz
	f, err := safeopen.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) && !gz {
		gz = true // compressed since it was planned
		f, err = safeopen.Open(s.path + gzSuffix)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil // pruned since it was planned
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if !gz {
		if _, err := f.Seek(s.start, io.SeekStart); err != nil {
			return err
		}
		return streamLines(f, s.skip, fn)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, zr, s.start); err != nil {
		return err
	}
	return streamLines(zr, s.skip, fn)
}

// lineStart returns where the last n lines of the first end bytes of r
// start, and how many lines that is (fewer than n when r holds fewer). A
// last line without a newline counts.
func lineStart(r io.ReaderAt, end int64, n int, buf []byte) (int64, int, error) {
	if end == 0 || n <= 0 {
		return end, 0, nil
	}
	found := 0 // newlines before the last line's own
	for pos, first := end, true; pos > 0; first = false {
		sz := min(pos, int64(len(buf)))
		pos -= sz
		b := buf[:sz]
		if _, err := r.ReadAt(b, pos); err != nil {
			return 0, 0, err
		}
		if first && b[len(b)-1] == '\n' {
			b = b[:len(b)-1]
		}
		for i := len(b); ; {
			j := bytes.LastIndexByte(b[:i], '\n')
			if j < 0 {
				break
			}
			if found++; found == n {
				return pos + int64(j) + 1, n, nil
			}
			i = j
		}
	}
	return 0, found + 1, nil
}

// lastNewline returns the offset of the last newline in the first end
// bytes of r (-1: none).
func lastNewline(r io.ReaderAt, end int64, buf []byte) (int64, error) {
	for pos := end; pos > 0; {
		sz := min(pos, int64(len(buf)))
		pos -= sz
		b := buf[:sz]
		if _, err := r.ReadAt(b, pos); err != nil {
			return 0, err
		}
		if j := bytes.LastIndexByte(b, '\n'); j >= 0 {
			return pos + int64(j), nil
		}
	}
	return -1, nil
}

// countLines counts the lines of a compressed file (a last one without a
// newline included).
func countLines(f *os.File, buf []byte) (int, error) {
	zr, err := gzip.NewReader(f)
	if err != nil {
		return 0, err
	}
	lines, last := 0, byte('\n')
	for {
		k, err := zr.Read(buf)
		if k > 0 {
			lines += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		lines++
	}
	return lines, nil
}

// streamLines calls fn with each line of r after the first skip ones (a
// last one without a newline included), holding one block and one line.
func streamLines(r io.Reader, skip int, fn func(string) error) error {
	br := bufio.NewReaderSize(r, tailBlock)
	var long []byte  // a line longer than the block, so far
	chunked := false // part of this line went out as a chunk
	for {
		frag, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, frag...)
			if len(long) >= maxTailLine {
				if skip == 0 {
					if err := fn(string(long)); err != nil {
						return err
					}
				}
				long, chunked = long[:0], true
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		line := bytes.TrimSuffix(frag, []byte{'\n'})
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		eof := err != nil
		if eof && len(line) == 0 && len(frag) == 0 {
			return nil
		}
		switch {
		case skip > 0:
			skip--
		case chunked && len(line) == 0:
			// its last chunk ended it
		default:
			if err := fn(string(line)); err != nil {
				return err
			}
		}
		chunked = false
		if eof {
			return nil
		}
	}
}
