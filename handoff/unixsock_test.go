package handoff

import (
	"errors"
	"net"
	"os"
	"path/filepath"
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
