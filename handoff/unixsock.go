package handoff

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// bindUnix returns a unix socket of type typ (SOCK_STREAM, SOCK_DGRAM)
// bound at addr ("@..." is abstract). A path socket is created with mode
// perm (less the agent's umask, as any file it creates): the mode is set
// on the socket before bind, never through the path, so nothing at the
// path (a symlink planted after the bind) can redirect it.
func bindUnix(typ int, addr string, perm uint32) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	name := addr
	if strings.HasPrefix(addr, "@") {
		name = "\x00" + addr[1:]
	} else if err := unix.Fchmod(fd, perm); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mode %o: %w", perm, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind: %w", err)
	}
	return fd, nil
}

// errReplaced is a socket path that is no longer the socket just bound.
var errReplaced = errors.New("the path is no longer a socket: something replaced it")

// ownSocket gives the socket file at path to uid (when uid >= 0 and the
// agent runs as another user, i.e. as root) without following a symlink,
// and checks the path is still a socket. A symlink planted at path (by a
// user who can write its folder) gets no chown, and neither does the file
// it points to.
func ownSocket(path string, uid int) error {
	if uid >= 0 && uid != os.Geteuid() {
		if err := unix.Fchownat(unix.AT_FDCWD, path, uid, -1, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown to uid %d: %w", uid, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return errReplaced
	}
	return nil
}

// ErrNotSocket is what RemoveSocketFile returns for a path that holds
// something else than a socket: it is left in place.
var ErrNotSocket = errors.New("handoff: not a socket file")

// RemoveSocketFile removes the unix socket file at path (absolute) without
// following a symbolic link in any component of it: its folder is opened
// with openat2(RESOLVE_NO_SYMLINKS) (one O_NOFOLLOW step per component on
// a kernel without openat2), and the name is removed from that very folder
// only while it is a socket. A folder an app's user swapped for a link
// gives an error wrapping ELOOP and removes nothing. A path already gone
// is not an error.
func RemoveSocketFile(path string) error {
	dir, base := filepath.Split(filepath.Clean(path))
	if !filepath.IsAbs(path) || base == "" {
		return fmt.Errorf("remove socket %s: not an absolute file path", path)
	}
	fd, err := openDirNoFollow(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove socket %s: open its folder without following links: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("remove socket %s: %w; left in place", path, ErrNotSocket)
	}
	if err := unix.Unlinkat(fd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove socket %s: %w", path, err)
	}
	return nil
}

// openDirNoFollow opens the folder dir (absolute) as an O_PATH descriptor
// without following a symbolic link in any component.
func openDirNoFollow(dir string) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if !errors.Is(err, unix.ENOSYS) {
		return fd, err
	}
	// Before Linux 5.6: one component at a time, none of them a link.
	fd, err = unix.Open("/", flags, 0)
	for _, name := range strings.Split(strings.Trim(filepath.Clean(dir), "/"), "/") {
		if err != nil || name == "" {
			break
		}
		next, err2 := unix.Openat(fd, name, flags|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		fd, err = next, err2
	}
	return fd, err
}
