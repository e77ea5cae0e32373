package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"github.com/deployd/deployd/internal/safeopen"
)

// WriteFileNoSymlinks is WriteFile for a file root keeps in a folder
// (state_dir): no component of path is followed if it is a link, and the
// temp file and the rename are made relative to the folder held open.
func WriteFileNoSymlinks(path string, data []byte, mode os.FileMode) error {
	d, err := safeopen.OpenDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer d.Close()
	name := filepath.Base(path)
	var f *os.File
	var tmp string
	for range 10 {
		tmp = "." + name + ".tmp-" + strconv.FormatUint(rand.Uint64(), 36)
		f, err = d.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer d.Remove(tmp) // after a successful rename there is nothing to remove
	if err := replace(f, data, mode, func() error { return d.Rename(tmp, name) }); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d.Sync()
	return nil
}
