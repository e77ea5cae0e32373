// Package safeopen opens paths that a less privileged user may change (a
// log folder, an env_file's folder, a release) without following a
// symbolic link at any component, and refuses a FIFO, a device or a folder
// where a regular file is meant. It asks the kernel with openat2
// (RESOLVE_NO_SYMLINKS, and RESOLVE_BENEATH below a folder held open) and
// falls back to a walk with O_NOFOLLOW at every component where openat2 is
// missing (Linux before 5.6, or a seccomp filter that answers ENOSYS).
package safeopen

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is wrapped when a path meant to be a regular file names a
// FIFO, a device, a socket or a folder.
var ErrNotRegular = errors.New("safeopen: not a regular file")

// ErrSymlink is wrapped when a component of the path is a symbolic link.
var ErrSymlink = errors.New("safeopen: a component of the path is a symbolic link")

// noOpenat2 is set once openat2 answered ENOSYS; then every open walks.
// Safe for concurrent use.
var noOpenat2 atomic.Bool

// OpenFile opens the regular file at path with flag (os.O_* bits;
// O_CLOEXEC and O_NOCTTY are added) and perm, following no symbolic link
// in any component. A FIFO is not waited for: it is refused, as is any
// other file that is not regular.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	return openRegular(unix.AT_FDCWD, path, path, flag, perm, unix.RESOLVE_NO_SYMLINKS)
}

// Open opens the regular file at path for reading (OpenFile).
func Open(path string) (*os.File, error) {
	return OpenFile(path, os.O_RDONLY, 0)
}

// openRegular opens path relative to dirfd (shown as name in errors) and
// checks with fstat that it is a regular file. It opens non-blocking, so a
// FIFO cannot hold it up, and clears O_NONBLOCK once the file is known.
func openRegular(dirfd int, path, name string, flag int, perm os.FileMode, resolve uint64) (*os.File, error) {
	fd, err := open(dirfd, path, flag|unix.O_NONBLOCK|unix.O_NOCTTY, perm, resolve)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: name, Err: notRegular(kind(st.Mode))}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// open is openat2(dirfd, path, flag|O_CLOEXEC, resolve), or the walk
// (walkOpen) where the kernel has no openat2. A symbolic link met on the
// way is reported as ErrSymlink (wrapping ELOOP).
func open(dirfd int, path string, flag int, perm os.FileMode, resolve uint64) (int, error) {
	flag |= unix.O_CLOEXEC
	if !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(flag), Resolve: resolve}
		if flag&unix.O_CREAT != 0 || flag&unix.O_TMPFILE == unix.O_TMPFILE {
			how.Mode = uint64(perm.Perm())
		}
		for {
			fd, err := unix.Openat2(dirfd, path, &how)
			switch {
			case err == nil:
				return fd, nil
			case errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN):
				continue // EAGAIN: a rename raced the lookup (RESOLVE_BENEATH)
			case errors.Is(err, unix.ENOSYS):
				noOpenat2.Store(true)
			case errors.Is(err, unix.ELOOP):
				return -1, symlinkErr(err)
			default:
				return -1, err
			}
			break
		}
	}
	fd, err := walkOpen(dirfd, path, flag, perm, resolve&unix.RESOLVE_BENEATH != 0)
	if errors.Is(err, unix.ELOOP) {
		return -1, symlinkErr(err)
	}
	return fd, err
}

// notRegular says what a file is instead of a regular one ("a FIFO, not a
// regular file"); errors.Is matches ErrNotRegular.
type notRegular string

func (n notRegular) Error() string        { return string(n) + ", not a regular file" }
func (n notRegular) Is(target error) bool { return target == ErrNotRegular }

func symlinkErr(err error) error { return symlinkError{err} }

// symlinkError is ELOOP from a path with a link on it; errors.Is matches
// ErrSymlink and the errno.
type symlinkError struct{ errno error }

func (e symlinkError) Error() string        { return "a symbolic link is on the path; none is followed there" }
func (e symlinkError) Is(target error) bool { return target == ErrSymlink }
func (e symlinkError) Unwrap() error        { return e.errno }

// walkOpen opens path from dirfd one component at a time, each with
// O_NOFOLLOW, as openat2 with RESOLVE_NO_SYMLINKS would (and, with
// beneath, refusing ".." and an absolute path as RESOLVE_BENEATH would).
func walkOpen(dirfd int, path string, flag int, perm os.FileMode, beneath bool) (int, error) {
	if path == "" {
		return -1, unix.ENOENT
	}
	cur, owned := dirfd, false
	if strings.HasPrefix(path, "/") {
		if beneath {
			return -1, unix.EXDEV
		}
		fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		cur, owned = fd, true
	}
	defer func() {
		if owned {
			unix.Close(cur)
		}
	}()
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 {
		parts = []string{"."}
	}
	for i, p := range parts {
		if beneath && p == ".." {
			return -1, unix.EXDEV
		}
		last := i == len(parts)-1
		fl, mode := unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(0)
		if last {
			fl, mode = flag|unix.O_NOFOLLOW, uint32(perm.Perm())
		}
		fd, err := unix.Openat(cur, p, fl, mode)
		if errors.Is(err, unix.ENOTDIR) && isLink(cur, p) {
			err = unix.ELOOP // O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR
		}
		if err != nil {
			return -1, err
		}
		if owned {
			unix.Close(cur)
		}
		cur, owned = fd, true
	}
	owned = false // handed to the caller
	return cur, nil
}

func isLink(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// kind names a file type that is not a regular file's.
func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a folder"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return "a special file"
}
