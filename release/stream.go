package release

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of an artifact a client streams (Source). The app's lock is held
// while it is read, so a client that stops sending must not hold it.
const (
	// DefaultStreamIdle is how long a read waits for the client's next
	// bytes when Source.Idle is 0.
	DefaultStreamIdle = 30 * time.Second
	// maxStreamTime bounds the whole read of a stream, however slowly
	// the client trickles it.
	maxStreamTime = 30 * time.Minute
	// maxStreamSize bounds the bytes read from a stream (compressed).
	maxStreamSize = maxTotalSize
)

// Problems of a stream.
const (
	Stalled  Problem = "stalled"   // the client sent nothing for Source.Idle
	TooLarge Problem = "too-large" // more than the limits allow
)

// Pollable returns f as the agent reads a client's stream: a regular file
// as it is; a pipe or a socket as a new descriptor of it in non-blocking
// mode, so that read deadlines apply and Close ends a read that waits
// (f is closed then). Anything else (a device, a folder) is refused.
func Pollable(f *os.File) (*os.File, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, refuse(Unreadable, "the artifact: %v", err)
	}
	m := fi.Mode()
	switch {
	case m.IsRegular():
		return f, nil
	case m&(os.ModeNamedPipe|os.ModeSocket) == 0:
		return nil, refuse(NotRegular, "the artifact is %s; pass a file, or a pipe carrying it", describe(m))
	}
	var fd int
	err = withFd(f, func(raw int) (err error) {
		fd, err = unix.FcntlInt(uintptr(raw), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the artifact stream: %w", err)
	}
	// The flag is the open file description's, shared with the client's
	// copy; the client passed it to be read by the agent only.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("the artifact stream: %w", err)
	}
	f.Close()
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func withFd(f *os.File, fn func(int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func describe(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a file nor a pipe"
}

// streamReader reads a client's stream with an idle deadline per read, an
// overall deadline and a size limit. Deadlines apply to a pollable file
// (Pollable); a regular file's reads do not wait on the client.
type streamReader struct {
	f    *os.File
	idle time.Duration
	end  time.Time // the overall deadline
	n    int64
}

func newStreamReader(f *os.File, idle time.Duration) *streamReader {
	if idle <= 0 {
		idle = DefaultStreamIdle
	}
	return &streamReader{f: f, idle: idle, end: time.Now().Add(maxStreamTime)}
}

func (s *streamReader) Read(p []byte) (int, error) {
	deadline := time.Now().Add(s.idle)
	if deadline.After(s.end) {
		deadline = s.end
	}
	if err := s.f.SetReadDeadline(deadline); err != nil && !errors.Is(err, os.ErrNoDeadline) {
		return 0, err
	}
	if len(p) > 0 && s.n >= maxStreamSize {
		return 0, refuse(TooLarge, "the artifact is over %d bytes", int64(maxStreamSize))
	}
	if max := maxStreamSize - s.n; int64(len(p)) > max {
		p = p[:max]
	}
	n, err := s.f.Read(p)
	s.n += int64(n)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if !time.Now().Before(s.end) {
			return n, refuse(Stalled, "the client took over %s to send the artifact", maxStreamTime)
		}
		return n, refuse(Stalled, "the client sent nothing for %s (read %d bytes of the artifact)", s.idle, s.n)
	}
	return n, err
}

var _ io.Reader = (*streamReader)(nil)
