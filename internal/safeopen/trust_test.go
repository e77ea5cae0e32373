package safeopen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCheckFolder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives folders to another user")
	}
	base := t.TempDir() // under /tmp: a sticky, world-writable ancestor
	mk := func(rel string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, rel)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(p, uint32(mode)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := Trust{UID: 0, GID: 0, Untrusted: func(gid uint32) string {
		if gid == 4242 {
			return "socket_group"
		}
		return ""
	}}
	good := mk("good", 0o755, 0)
	userOwned := mk("user", 0o755, 4242)
	world := mk("world", 0o777, 0)
	sticky := mk("sticky", 0o1777, 0)
	stickyChild := mk("sticky/child", 0o755, 0)
	stickyUserChild := mk("sticky/userchild", 0o755, 4242)
	group := mk("group", 0o775, 0)
	if err := os.Chown(group, 0, 4242); err != nil {
		t.Fatal(err)
	}
	otherGroup := mk("othergroup", 0o775, 0)
	if err := os.Chown(otherGroup, 0, 4343); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, bad, why string
	}{
		{good, "", ""},
		{filepath.Join(good, "not", "yet"), "", ""},
		{stickyChild, "", ""},
		{otherGroup, "", ""},
		{filepath.Join(userOwned, "logs"), userOwned, "owned by a user other than root"},
		{world, world, "writable by everyone"},
		{sticky, sticky, "writable by everyone"},
		{stickyUserChild, stickyUserChild, "owned by a user other than root"},
		{filepath.Join(group, "x"), group, "writable by its group, socket_group"},
		{filepath.Join(link, "x"), link, "is a symbolic link"},
	} {
		err := root.CheckFolder(tc.path)
		var ue *UnsafeFolderError
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.path, err)
		case tc.bad != "" && !errors.As(err, &ue):
			t.Errorf("%s: %v, want an UnsafeFolderError", tc.path, err)
		case tc.bad != "" && (ue.Folder != tc.bad || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%s: %v, want folder %s and %q", tc.path, err, tc.bad, tc.why)
		}
		if err != nil {
			t.Logf("%s: %v", tc.path, err)
		}
	}
	// The agent's own user may own them.
	if err := (Trust{UID: 4242, GID: 4242}).CheckFolder(filepath.Join(userOwned, "logs")); err != nil {
		t.Errorf("a folder of the agent's user: %v", err)
	}
}
