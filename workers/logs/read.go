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
	"strings"
	"syscall"
	"time"

	"github.com/deployd/deployd/internal/safeopen"
)

const (
	tailBlock  = 64 << 10               // LastLines reads backwards in blocks of this size
	followPoll = 200 * time.Millisecond // how often Follow looks for new data
)

// LastLines returns the last n lines of the log at path, oldest first. It
// reads the current file backwards from its end, so its cost depends on n,
// not on the file's size; if the current file has fewer than n lines, it
// continues in the rotated files, newest first (a compressed one is read
// whole). A missing current file counts as empty as long as rotated files
// exist.
func LastLines(path string, n int) ([]string, error) {
	if n <= 0 {
		return nil, nil
	}
	lines, err := lastLinesOf(path, n)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return nil, fmt.Errorf("logs: last lines of %s: %w", path, err)
	}
	if len(lines) >= n {
		return lines, nil
	}
	backups, err := listBackups(path)
	if err != nil {
		return nil, fmt.Errorf("logs: last lines of %s: %w", path, err)
	}
	if missing && len(backups) == 0 {
		return nil, fmt.Errorf("logs: last lines of %s: %w", path, fs.ErrNotExist)
	}
	for _, b := range backups {
		var more []string
		if b.gz {
			more, err = lastLinesOfGzip(b.path, n-len(lines))
		} else {
			more, err = lastLinesOf(b.path, n-len(lines))
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue // compressed or pruned meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("logs: last lines of %s: %w", path, err)
		}
		lines = append(more, lines...)
		if len(lines) >= n {
			break
		}
	}
	return lines, nil
}

// lastLinesOf returns the last n lines of a plain file, reading backwards.
func lastLinesOf(path string, n int) ([]string, error) {
	f, err := safeopen.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size == 0 {
		return nil, nil
	}
	var blocks [][]byte // from the end backwards
	newlines := 0       // not counting the file's final newline
	pos := size
	for pos > 0 && newlines < n {
		sz := min(pos, tailBlock)
		pos -= sz
		b := make([]byte, sz)
		if _, err := f.ReadAt(b, pos); err != nil {
			return nil, err
		}
		newlines += bytes.Count(b, []byte{'\n'})
		if len(blocks) == 0 && b[len(b)-1] == '\n' {
			newlines--
		}
		blocks = append(blocks, b)
	}
	var data []byte
	for i := len(blocks) - 1; i >= 0; i-- {
		data = append(data, blocks[i]...)
	}
	data = bytes.TrimSuffix(data, []byte{'\n'})
	lines := strings.Split(string(data), "\n")
	// With pos > 0 the first element is the end of a longer line; there are
	// at least n more after it.
	return lines[max(len(lines)-n, 0):], nil
}

// lastLinesOfGzip returns the last n lines of a compressed rotated file.
func lastLinesOfGzip(path string, n int) ([]string, error) {
	f, err := safeopen.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	t := NewTail(n)
	br := bufio.NewReaderSize(zr, tailBlock)
	for {
		s, err := br.ReadString('\n')
		if len(s) > 0 {
			t.Add(strings.TrimSuffix(s, "\n"))
		}
		if errors.Is(err, io.EOF) {
			return t.Lines(), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// Follow calls fn with every line appended to the log at path, starting at
// byte offset from (or at the current end when from < 0), like `tail -F`:
// when the file is rotated (renamed and replaced) it reads the old file to its
// end, then continues at the start of the new one; when it is truncated, it
// starts over at its beginning. It polls every 200ms, waits for the file if it
// does not exist yet, and returns nil when ctx is done. A line longer than
// DefaultMaxLine is delivered in chunks, as Capture does.
func Follow(ctx context.Context, path string, from int64, fn func(line string)) error {
	_, err := FollowFrom(ctx, path, from, fn)
	return err
}

// Position is where a follow stopped: the file it was reading (device and
// inode; 0 when none existed yet) and the offset of the first byte it did
// not deliver (the start of a line).
type Position struct {
	Dev, Ino uint64
	Offset   int64
}

// FollowFrom is Follow, which also returns where it stopped once ctx is
// done, so that a later follow of the same file goes on from there.
func FollowFrom(ctx context.Context, path string, from int64, fn func(line string)) (Position, error) {
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			return true
		}
	}
	fl := follower{fn: fn, buf: make([]byte, tailBlock)}
	defer fl.close()
	for {
		if fl.f == nil {
			ok, err := fl.open(path, from)
			if err != nil {
				return Position{}, err
			}
			if !ok {
				if !wait() {
					return Position{}, nil
				}
				continue
			}
			from = 0 // a file that replaces this one is read from its start
		}
		if err := fl.read(ctx); err != nil {
			return Position{}, err
		}
		again, err := fl.check(path)
		if err != nil {
			return Position{}, err
		}
		if !again && !wait() {
			return fl.position(), nil
		}
	}
}

// follower is the state of one Follow call, owned by it.
type follower struct {
	fn      func(string)
	f       *os.File
	offset  int64  // of the next byte to read in f
	partial []byte // read, but not yet ended by a newline
	buf     []byte
}

// open opens path at offset from (the end if from < 0); false if it does not
// exist yet.
func (fl *follower) open(path string, from int64) (bool, error) {
	f, err := safeopen.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("logs: follow: %w", err)
	}
	whence := io.SeekStart
	if from < 0 {
		from, whence = 0, io.SeekEnd
	}
	off, err := f.Seek(from, whence)
	if err != nil {
		f.Close()
		return false, fmt.Errorf("logs: follow: %w", err)
	}
	fl.f, fl.offset = f, off
	return true, nil
}

// read delivers the complete lines from the current offset to the end.
func (fl *follower) read(ctx context.Context) error {
	for ctx.Err() == nil {
		n, err := fl.f.Read(fl.buf)
		fl.offset += int64(n)
		fl.partial = append(fl.partial, fl.buf[:n]...)
		k := deliver(fl.partial, 0, DefaultMaxLine, false, fl.fn)
		fl.partial = fl.partial[:copy(fl.partial, fl.partial[k:])]
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("logs: follow: %w", err)
		}
		if n == 0 {
			return nil
		}
	}
	return nil
}

// check looks, at the end of the file, whether path was rotated or
// truncated, and switches files or offsets; true means read again now.
func (fl *follower) check(path string) (bool, error) {
	cur, err := fl.f.Stat()
	if err != nil {
		return false, fmt.Errorf("logs: follow: %w", err)
	}
	st, err := os.Lstat(path) // a link put in its place is not followed
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil // between the rename and the new file: keep the old one
	case err != nil:
		return false, fmt.Errorf("logs: follow: %w", err)
	case !os.SameFile(st, cur):
		// Rotated: what was written before the rename is in the old file.
		if err := fl.read(context.Background()); err != nil {
			return false, err
		}
		deliver(fl.partial, 0, DefaultMaxLine, true, fl.fn)
		fl.partial = fl.partial[:0]
		fl.close()
		return true, nil
	case cur.Size() < fl.offset:
		// Truncated (`deployd logs --flush`): start over, as tail -F does.
		if _, err := fl.f.Seek(0, io.SeekStart); err != nil {
			return false, fmt.Errorf("logs: follow: %w", err)
		}
		fl.offset = 0
		fl.partial = fl.partial[:0]
		return true, nil
	}
	return false, nil
}

// position is where fl stands: its file and the start of the line it has
// not delivered yet.
func (fl *follower) position() Position {
	if fl.f == nil {
		return Position{}
	}
	p := Position{Offset: fl.offset - int64(len(fl.partial))}
	if fi, err := fl.f.Stat(); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			p.Dev, p.Ino = uint64(st.Dev), st.Ino
		}
	}
	return p
}

func (fl *follower) close() {
	if fl.f != nil {
		fl.f.Close()
		fl.f = nil
	}
}
