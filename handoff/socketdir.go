package handoff

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/internal/safeopen"
)

// socketDir is the folder of a unix socket path the agent is about to
// bind, held open (O_PATH) from before the bind until after it.
type socketDir struct {
	fd         int
	path, base string
}

// openSocketDir opens the folder of the unix socket at path (absolute)
// with no symbolic link followed at any component (openDirNoFollow), then
// checks its folders from "/" down with check (nil: those of the agent's
// own user and root only, safeopen.Trust with no group): each one owned by
// root or the agent's user and writable by nobody else, a sticky folder
// such as /tmp only above one of those. And the folder held open must be
// the one checked. An app's user who could write a folder on the path
// could otherwise swap it for a link and have root bind a socket, with
// the config's name, anywhere root can write (issue 39).
//
// The bind itself goes by path: bind(2) has no *at form, and a path
// through /proc/self/fd would change the name getsockname, /proc/net/unix
// (Holder) and the app see. So a window remains between this check and
// bind(2); no non-root user can use it, since no non-root user can change
// a folder on a path that passed the check. holdsSocket checks afterwards
// that the socket is in the folder held open.
func openSocketDir(path string, check func(dir string) error) (*socketDir, error) {
	dir, base := filepath.Split(filepath.Clean(path))
	if !filepath.IsAbs(path) || base == "" {
		return nil, fmt.Errorf("unix socket %s: not an absolute file path", path)
	}
	if check == nil {
		check = ownFolders
	}
	fd, err := openDirNoFollow(dir)
	// The check first: for a link on the path it names the link and the
	// real folder, which the open's ELOOP does not.
	if cerr := check(filepath.Clean(dir)); cerr != nil {
		if err == nil {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("unix socket %s: %w; nothing was bound", path, cerr)
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("unix socket %s: its folder %s does not exist; create it (root's, mode 0755) or choose another path", path, dir)
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("unix socket %s: a symbolic link is on the path of its folder %s, and none is followed there: name the real folder; nothing was bound", path, dir)
	case err != nil:
		return nil, fmt.Errorf("unix socket %s: open its folder without following links: %w", path, err)
	}
	var held, named unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("unix socket %s: stat its folder: %w", path, err)
	}
	if err := unix.Lstat(filepath.Clean(dir), &named); err != nil || held.Dev != named.Dev || held.Ino != named.Ino {
		unix.Close(fd)
		return nil, fmt.Errorf("unix socket %s: its folder %s was replaced while it was checked; nothing was bound", path, dir)
	}
	return &socketDir{fd: fd, path: path, base: base}, nil
}

// ownFolders is the check of a Want without CheckFolder.
func ownFolders(dir string) error {
	t := safeopen.Trust{UID: os.Geteuid(), GID: os.Getegid()}
	if err := t.CheckFolder(dir); err != nil {
		return fmt.Errorf("%w, or %s", err, safeopen.SocketFolderFix)
	}
	return nil
}

// holdsSocket checks that the socket just bound at d.path is in the folder
// held open: a socket file by that name is there. A nil d (not a unix
// path) holds nothing to check.
func (d *socketDir) holdsSocket() error {
	if d == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, d.base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("unix socket %s: the socket is not in the folder checked before the bind: the folder was replaced; check who can change %s", d.path, filepath.Dir(d.path))
	}
	return nil
}

// close closes the folder; safe on nil.
func (d *socketDir) close() {
	if d != nil {
		unix.Close(d.fd)
	}
}
