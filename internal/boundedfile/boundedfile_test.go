package boundedfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(small, link); err != nil {
		t.Fatal(err)
	}
	linkedDir := filepath.Join(t.TempDir(), "dir")
	if err := os.Symlink(dir, linkedDir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		path string
		o    Options
		want error
	}{
		{"fifo", fifo, Options{Max: 1024}, ErrNotRegular},              // must not wait for a writer
		{"link to /dev/zero", zero, Options{Max: 1024}, ErrNotRegular}, // followed: a device
		{"link to /dev/zero, nofollow", zero, Options{Max: 1024, NoFollow: true}, ErrNotRegular},
		{"device", "/dev/zero", Options{Max: 1024}, ErrNotRegular},
		{"folder", dir, Options{Max: 1024}, ErrNotRegular},
		{"too large", big, Options{Max: 1024}, ErrTooLarge},
		{"link, nofollow", link, Options{Max: 1024, NoFollow: true}, ErrNotRegular},
		{"link followed", link, Options{Max: 1024}, nil},
		{"small", small, Options{Max: 2, NoFollow: true}, nil},
		{"linked folder, nosymlinks", filepath.Join(linkedDir, "small"), Options{Max: 1024, NoSymlinks: true}, ErrNotRegular},
		{"fifo, nosymlinks", fifo, Options{Max: 1024, NoSymlinks: true}, ErrNotRegular},
		{"small, nosymlinks", small, Options{Max: 2, NoSymlinks: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ReadFile(tc.path, tc.o)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ReadFile(%s) = %q, %v; want %v", tc.path, b, err, tc.want)
			}
			if tc.want == nil && string(b) != "ok" {
				t.Errorf("read %q, want ok", b)
			}
		})
	}
}
