// Package boundedfile reads a file another party may control (a config,
// a record in a folder an app's user can write) the way the agent must:
// never blocking on a FIFO, never reading a device, never more than a
// limit, and, when asked, never through a symbolic link.
package boundedfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/deployd/deployd/internal/safeopen"
)

// ErrNotRegular is wrapped when the path names a FIFO, a device, a socket,
// a folder or (with NoFollow) a symbolic link.
var ErrNotRegular = errors.New("boundedfile: not a regular file")

// ErrTooLarge is wrapped when the file holds more than the limit.
var ErrTooLarge = errors.New("boundedfile: file too large")

// Options say how a file is read.
type Options struct {
	// Max is the most bytes read; a larger file is refused unread.
	Max int64
	// NoFollow refuses a symbolic link as the last component (O_NOFOLLOW).
	NoFollow bool
	// NoSymlinks refuses a symbolic link at any component of the path
	// (safeopen): for files in folders a less privileged user may write.
	NoSymlinks bool
}

// ReadFile reads the regular file at path, of at most o.Max bytes. It opens
// with O_NONBLOCK, so that a FIFO does not wait for a writer, and checks
// the open file (fstat) before reading a byte. A file that grows past
// o.Max while it is read is refused too.
func ReadFile(path string, o Options) ([]byte, error) {
	flags := os.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOCTTY
	if o.NoFollow {
		flags |= syscall.O_NOFOLLOW
	}
	open := os.OpenFile
	if o.NoSymlinks {
		open = safeopen.OpenFile
	}
	f, err := open(path, flags, 0)
	if errors.Is(err, safeopen.ErrNotRegular) {
		return nil, &fs.PathError{Op: "open", Path: path, Err: &refusal{ErrNotRegular, errors.Unwrap(err).Error()}}
	}
	if errors.Is(err, syscall.ELOOP) && (o.NoFollow || o.NoSymlinks) {
		msg := "a symbolic link, not a regular file"
		if o.NoSymlinks {
			msg = "a symbolic link is on its path; none is followed there"
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: &refusal{ErrNotRegular, msg}}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: path, Err: &refusal{ErrNotRegular, kind(fi.Mode()) + ", not a regular file"}}
	}
	if fi.Size() > o.Max {
		return nil, &fs.PathError{Op: "read", Path: path, Err: &refusal{ErrTooLarge, fmt.Sprintf("%d bytes, over the limit of %d", fi.Size(), o.Max)}}
	}
	b, err := io.ReadAll(io.LimitReader(f, o.Max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > o.Max {
		return nil, &fs.PathError{Op: "read", Path: path, Err: &refusal{ErrTooLarge, fmt.Sprintf("over the limit of %d bytes", o.Max)}}
	}
	return b, nil
}

// refusal says why a file was refused, for a person; errors.Is matches
// its sentinel.
type refusal struct {
	is  error
	msg string
}

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { return target == r.is }

// kind names a file mode that is not a regular file's.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}
