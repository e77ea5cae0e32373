// Package atomicfile owns the one way deployd replaces a file on disk:
// write a temp file next to it, fsync, rename over it, fsync the folder, so
// that a crash leaves the old file or the new one, never a torn one.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data (mode mode) atomically and durably.
// On error path is unchanged and no temp file is left.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := replace(f, data, mode, func() error { return os.Rename(tmp, path) }); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	SyncDir(filepath.Dir(path))
	return nil
}

// replace writes data to the temp file f (mode mode), closes it, and then
// renames it into place with rename.
func replace(f *os.File, data []byte, mode os.FileMode, rename func() error) error {
	err := write(f, data, mode)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rename()
	}
	return err
}

func write(f *os.File, data []byte, mode os.FileMode) error {
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	return f.Sync()
}

// SyncDir makes renames in dir durable (best effort: some file systems
// cannot fsync a folder).
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
