package logs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/deployd/deployd/internal/safeopen"
)

const (
	tailBlock  = 64 << 10               // files are read in blocks of this size
	followPoll = 200 * time.Millisecond // how often Follow looks for new data
)

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
	return followFrom(ctx, path, nil, from, fn)
}

// followFrom is FollowFrom, which starts in f, a file of the log at path
// (unless nil), at its current offset from.
func followFrom(ctx context.Context, path string, f *os.File, from int64, fn func(line string)) (Position, error) {
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
	fl := follower{fn: fn, f: f, offset: from}
	defer fl.close()
	if f != nil {
		from = 0 // a file that replaces it is read from its start
	}
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
	partial []byte // read, but not yet ended by a newline; nil when empty
}

// readBlocks are the blocks follows read into, each held only while its
// follow reads: one that waits for lines (most do, most of the time)
// holds none, so that a client following every app's log costs little.
var readBlocks = sync.Pool{New: func() any { return new([tailBlock]byte) }}

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
	block := readBlocks.Get().(*[tailBlock]byte)
	defer readBlocks.Put(block)
	defer func() {
		if len(fl.partial) == 0 {
			fl.partial = nil
		}
	}()
	for ctx.Err() == nil {
		n, err := fl.f.Read(block[:])
		fl.offset += int64(n)
		fl.partial = append(fl.partial, block[:n]...)
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
