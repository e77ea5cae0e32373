package handoff

import (
	"errors"
	"fmt"
	"os"
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
