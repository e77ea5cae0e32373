package safeopen

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is a folder held open: every name is looked up in that folder (the
// one opened, even if its path is renamed or replaced later) and no call
// follows a symbolic link. Names are single components: "a.log", never
// "x/a.log", "." or "..". Safe for concurrent use; Close once.
type Dir struct {
	f    *os.File
	path string
}

// OpenDir opens the folder at path, following no symbolic link in any
// component.
func OpenDir(path string) (*Dir, error) {
	fd, err := open(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_DIRECTORY, 0, unix.RESOLVE_NO_SYMLINKS)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), path), path: filepath.Clean(path)}, nil
}

// Path is the path the folder was opened at.
func (d *Dir) Path() string { return d.path }

// Close closes the folder.
func (d *Dir) Close() error { return d.f.Close() }

// Sync makes renames and removals in the folder durable (best effort).
func (d *Dir) Sync() { _ = d.f.Sync() }

// OpenFile opens the regular file name in the folder (OpenFile).
func (d *Dir) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return openRegular(d.fd(), name, d.join(name), flag, perm, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS)
}

// Rename renames oldName to newName within the folder. Like rename(2) it
// never follows a link: a link named oldName is itself moved.
func (d *Dir) Rename(oldName, newName string) error {
	if err := checkName(oldName); err != nil {
		return &os.LinkError{Op: "rename", Old: d.join(oldName), New: d.join(newName), Err: err}
	}
	if err := checkName(newName); err != nil {
		return &os.LinkError{Op: "rename", Old: d.join(oldName), New: d.join(newName), Err: err}
	}
	if err := unix.Renameat(d.fd(), oldName, d.fd(), newName); err != nil {
		return &os.LinkError{Op: "rename", Old: d.join(oldName), New: d.join(newName), Err: err}
	}
	return nil
}

// Remove removes the file (or link: never its target) name in the folder.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: err}
	}
	if err := unix.Unlinkat(d.fd(), name, 0); err != nil {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: err}
	}
	return nil
}

// Exists tells whether the folder has an entry name, of any type (a link
// is not followed).
func (d *Dir) Exists(name string) bool {
	if checkName(name) != nil {
		return false
	}
	var st unix.Stat_t
	return unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// ReadDir lists the folder's entries (in directory order).
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.ReadDir(-1)
}

func (d *Dir) fd() int { return int(d.f.Fd()) }

func (d *Dir) join(name string) string { return filepath.Join(d.path, name) }

// checkName refuses a name that is not one component of a folder.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("%q is not a name in the folder", name)
	}
	return nil
}
