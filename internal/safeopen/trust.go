package safeopen

import (
	"errors"
	"fmt"
	"io/fs"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Trust says who besides root may write the folders that hold what root
// reads and writes (logs, state, env files): the agent's own user, and
// groups that no app's user and no member is in.
type Trust struct {
	// UID and GID are the agent's effective ids.
	UID, GID int
	// Untrusted names why a group may not write such a folder (say
	// "socket_group", "the group of app web's user"), "" when it may.
	Untrusted func(gid uint32) string
}

// UnsafeFolderError is a folder on a path that someone other than root and
// the agent's user can change: whoever can rename or create entries in it
// could swap a folder or file below it for a link.
type UnsafeFolderError struct {
	Folder     string
	UID, GID   uint32
	Mode       fs.FileMode
	Why, Fix   string
	linkTarget string
}

func (e *UnsafeFolderError) Error() string {
	return fmt.Sprintf("folder %s (owner %s, group %s, mode %s) %s;\n  fix: %s",
		e.Folder, account(e.UID, false), account(e.GID, true), modeString(e.Mode), e.Why, e.Fix)
}

// SocketFolderFix is the way out for a unix socket root binds in a folder
// that someone other than root can change.
const SocketFolderFix = "put the socket in a folder only root can write, such as /run/deployd " +
	"(the workers get the socket as an open descriptor: the app's user needs no access to its folder)"

// CheckFolder checks every existing component of the folder path, from "/"
// down: each must be a folder (not a link) owned by root or t.UID, not
// writable by others unless sticky (an ancestor like /tmp, whose next
// component is then checked to be root's or the agent's), and not writable
// by a group t.Untrusted names. Components that do not exist yet are
// fine: the agent creates them, owned by itself, mode 0755.
func (t Trust) CheckFolder(path string) error {
	path = filepath.Clean(path)
	if !filepath.IsAbs(path) {
		return fmt.Errorf("safeopen: %q is not an absolute path", path)
	}
	comps := []string{"/"}
	for _, name := range strings.Split(path, "/") {
		if name != "" {
			comps = append(comps, filepath.Join(comps[len(comps)-1], name))
		}
	}
	for _, c := range comps {
		var st unix.Stat_t
		if err := unix.Lstat(c, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return &fs.PathError{Op: "lstat", Path: c, Err: err}
		}
		if err := t.checkOne(c, &st, c == path); err != nil {
			return err
		}
	}
	return nil
}

// checkOne checks one component (CheckFolder); last: it is the folder
// itself, where a sticky bit does not help (anyone may create a file in it).
func (t Trust) checkOne(c string, st *unix.Stat_t, last bool) error {
	e := &UnsafeFolderError{Folder: c, UID: st.Uid, GID: st.Gid, Mode: fileMode(st.Mode)}
	perm := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		e.Why = "is a symbolic link"
		e.Fix = "name the real folder"
		if real, err := filepath.EvalSymlinks(c); err == nil {
			e.Fix += " (" + real + ")"
		}
		e.Fix += ": deployd follows no link in these paths"
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		e.Why, e.Fix = "is not a folder", "name a folder"
	case st.Uid != 0 && int(st.Uid) != t.UID:
		e.Why = "is owned by a user other than root and the agent's, who could swap a file below it for a link"
		e.Fix = fmt.Sprintf("chown root %s and chmod go-w %s", c, c)
	case perm&0o002 != 0 && (perm&unix.S_ISVTX == 0 || last):
		e.Why = "is writable by everyone: any user could put a link where root reads or writes"
		e.Fix = fmt.Sprintf("chmod o-w %s", c)
	case perm&0o020 != 0 && st.Gid != 0 && int(st.Gid) != t.GID && t.Untrusted != nil && t.Untrusted(st.Gid) != "":
		e.Why = fmt.Sprintf("is writable by its group, %s, whose members could swap a file below it for a link", t.Untrusted(st.Gid))
		e.Fix = fmt.Sprintf("chmod g-w %s, or chgrp root %s", c, c)
	default:
		return nil
	}
	return e
}

func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	}
	return mode
}

// modeString is a mode as ls and chmod write it: "drwxr-xr-x (0755)".
func modeString(m fs.FileMode) string {
	octal := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		octal |= 0o1000
	}
	return fmt.Sprintf("%s (%04o)", strings.Replace(m.String(), "dt", "d", 1), octal)
}

// account is "uid 1001 (ann)", or "uid 1001" when it has no name.
func account(id uint32, group bool) string {
	what, name := "uid", ""
	s := strconv.FormatUint(uint64(id), 10)
	if group {
		what = "gid"
		if g, err := user.LookupGroupId(s); err == nil {
			name = g.Name
		}
	} else if u, err := user.LookupId(s); err == nil {
		name = u.Username
	}
	if name == "" {
		return what + " " + s
	}
	return fmt.Sprintf("%s %s (%s)", what, s, name)
}
