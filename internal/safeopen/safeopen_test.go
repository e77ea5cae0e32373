package safeopen

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// both runs fn with openat2 and with the walk that stands in for it.
func both(t *testing.T, fn func(t *testing.T)) {
	t.Run("openat2", fn)
	t.Run("walk", func(t *testing.T) { withWalk(t); fn(t) })
}

// victim is a folder with a secret in it, and a folder beside it for the
// attacker's links.
func victim(t *testing.T) (secretDir, attacker string) {
	root := t.TempDir()
	secretDir = filepath.Join(root, "secret")
	attacker = filepath.Join(root, "attacker")
	for _, d := range []string{secretDir, attacker} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(secretDir, "env"), []byte("TOKEN=root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secretDir, attacker
}

func TestOpenFollowsNoLinkAtAnyComponent(t *testing.T) {
	both(t, func(t *testing.T) {
		secretDir, attacker := victim(t)
		parent := filepath.Join(attacker, "app")
		if err := os.Symlink(secretDir, parent); err != nil {
			t.Fatal(err)
		}
		last := filepath.Join(attacker, "last")
		if err := os.Symlink(filepath.Join(secretDir, "env"), last); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{filepath.Join(parent, "env"), last} {
			f, err := Open(p)
			if err == nil {
				f.Close()
				t.Fatalf("Open(%s) went through a link", p)
			}
			if !errors.Is(err, ErrSymlink) || !errors.Is(err, syscall.ELOOP) {
				t.Errorf("Open(%s): %v, want ErrSymlink", p, err)
			}
		}
		// Created through a link to a folder: refused, nothing made there.
		f, err := OpenFile(filepath.Join(parent, "new.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err == nil {
			f.Close()
			t.Fatal("created a file through a linked folder")
		}
		if _, err := os.Lstat(filepath.Join(secretDir, "new.log")); err == nil {
			t.Error("a file was created in the linked-to folder")
		}
		// The real path opens.
		f, err = Open(filepath.Join(secretDir, "env"))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	})
}

func TestOpenRefusesWhatIsNotARegularFile(t *testing.T) {
	both(t, func(t *testing.T) {
		dir := t.TempDir()
		fifo := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{fifo, dir, "/dev/null"} {
			done := make(chan error, 1)
			go func() {
				f, err := OpenFile(p, os.O_RDONLY, 0)
				if err == nil {
					f.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) {
					t.Errorf("OpenFile(%s): %v, want ErrNotRegular", p, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("OpenFile(%s) blocked", p)
			}
		}
	})
}

func TestDirRotationMovesLinksNotTargets(t *testing.T) {
	both(t, func(t *testing.T) {
		secretDir, attacker := victim(t)
		d, err := OpenDir(attacker)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := os.Symlink(filepath.Join(secretDir, "env"), filepath.Join(attacker, "web.log")); err != nil {
			t.Fatal(err)
		}
		if f, err := d.OpenFile("web.log", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640); err == nil {
			f.Close()
			t.Fatal("opened a link for appending")
		} else if !errors.Is(err, ErrSymlink) {
			t.Errorf("open a link: %v, want ErrSymlink", err)
		}
		if err := d.Rename("web.log", "web-1.log"); err != nil {
			t.Fatal(err)
		}
		if !d.Exists("web-1.log") || d.Exists("web.log") {
			t.Error("rename did not move the link")
		}
		if err := d.Remove("web-1.log"); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(secretDir, "env")); err != nil || string(b) != "TOKEN=root\n" {
			t.Errorf("the link's target changed: %q, %v", b, err)
		}
		for _, bad := range []string{"../secret/env", "..", "", "a/b"} {
			if f, err := d.OpenFile(bad, os.O_RDONLY, 0); err == nil {
				f.Close()
				t.Errorf("OpenFile(%q) opened", bad)
			}
		}
		// The folder held open stays the one opened when its path is swapped.
		if err := os.Rename(attacker, attacker+".old"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secretDir, attacker); err != nil {
			t.Fatal(err)
		}
		f, err := d.OpenFile("env", os.O_RDONLY, 0)
		if err == nil {
			f.Close()
			t.Error("the held folder resolved a name in the swapped-in folder")
		}
		if _, err := OpenDir(attacker); !errors.Is(err, ErrSymlink) {
			t.Errorf("OpenDir of a link: %v, want ErrSymlink", err)
		}
	})
}
