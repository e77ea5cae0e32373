package handoff

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The last lease of a unix listener removes its socket file, but never
// through a link: a folder of the path that was swapped for a link (by a
// user who can write its parent) makes the registry leave everything in
// place, the file the link leads to included.
func TestRegistryNeverRemovesThroughALink(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "app.sock")
	r := NewRegistry(nil, nil, nil)
	lease, err := r.Acquire("web", []Want{{URL: "unix://" + path, Network: "unix", Address: path, Name: "web"}})
	if err != nil {
		t.Fatal(err)
	}
	// Another folder holds a socket file of the same name (a regular
	// file would be left by the socket check alone; a socket is not).
	victim := filepath.Join(base, "root-only")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", filepath.Join(victim, "app.sock"))
	if err != nil {
		t.Fatal(err)
	}
	other.(*net.UnixListener).SetUnlinkOnClose(false)
	defer other.Close()
	if err := os.Rename(dir, filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, dir); err != nil {
		t.Fatal(err)
	}
	lease.Release()
	if _, err := os.Lstat(filepath.Join(victim, "app.sock")); err != nil {
		t.Fatalf("the socket file behind the link was removed: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "moved", "app.sock")); err != nil {
		t.Errorf("the moved socket file: %v", err)
	}
	if err := RemoveSocketFile(path); !errors.Is(err, unix.ELOOP) {
		t.Errorf("RemoveSocketFile through a link = %v; want ELOOP", err)
	}
}

// RemoveSocketFile removes a socket, leaves anything else, and takes a
// path already gone as done.
func TestRemoveSocketFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if err := RemoveSocketFile(sock); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there: %v", err)
	}
	if err := RemoveSocketFile(sock); err != nil {
		t.Errorf("a second remove: %v", err)
	}
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("x"), 0o600)
	if err := RemoveSocketFile(plain); !errors.Is(err, ErrNotSocket) {
		t.Errorf("RemoveSocketFile of a regular file = %v; want ErrNotSocket", err)
	}
	if _, err := os.Lstat(plain); err != nil {
		t.Errorf("the regular file was removed: %v", err)
	}
}

// A unix listener is bound only in a folder chain no one but root (or the
// agent's user) can change, checked with no link followed: a folder of the
// path swapped for a link into a root-only folder (by a user who could
// write its parent), a folder another user owns, and a folder the Want's
// own check refuses each make the registry bind nothing, and nothing
// appears in the folder the link leads to. A check that passes the link
// is still stopped by the folder's open without links.
func TestRegistryNeverBindsThroughALink(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "root-only")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(base, "run")
	if err := os.Symlink(victim, linked); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused by the config's groups")
	type bindCase struct {
		name, dir string
		check     func(string) error
		want      []string
	}
	cases := []bindCase{
		{"linked folder", linked, nil, []string{"folder " + linked, "is a symbolic link", "name the real folder (" + victim + ")", "nothing was bound"}},
		{"the Want's check", other, func(string) error { return refused }, []string{refused.Error(), "nothing was bound"}},
		{"a check that misses the link", linked, func(string) error { return nil }, []string{"a symbolic link is on the path of its folder", "nothing was bound"}},
	}
	if os.Geteuid() == 0 {
		owned := filepath.Join(base, "owned")
		if err := os.Mkdir(owned, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(owned, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, bindCase{"another user's folder", owned, nil, []string{"folder " + owned + " (owner uid 4242", "chown root " + owned, "put the socket in a folder only root can write"}})
	}
	for _, tc := range cases {
		path := filepath.Join(tc.dir, "app.sock")
		r := NewRegistry(nil, nil, nil)
		lease, err := r.Acquire("web", []Want{{URL: "unix://" + path, Network: "unix", Address: path, Name: "web", CheckFolder: tc.check}})
		if err == nil {
			lease.Release()
			t.Errorf("%s: bound %s", tc.name, path)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the error lacks %q:\n%v", tc.name, w, err)
			}
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: something is at %s: %v", tc.name, path, err)
		}
	}
	if ents, err := os.ReadDir(victim); err != nil || len(ents) != 0 {
		t.Errorf("the root-only folder behind the link holds %v (%v)", ents, err)
	}
	// The same folder, the real one, is fine.
	path := filepath.Join(victim, "app.sock")
	lease, err := NewRegistry(nil, nil, nil).Acquire("web", []Want{{URL: "unix://" + path, Network: "unix", Address: path, Name: "web"}})
	if err != nil {
		t.Fatalf("the real folder: %v", err)
	}
	lease.Release()
}
