package release

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// RemoveLeftovers removes what installs cut short left under every app's
// releases folder (staging folders .tmp-*), except those an install still
// holds (another agent's, during an upgrade). It returns what it removed.
func (s *Store) RemoveLeftovers() ([]string, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			removed = append(removed, s.removeStaging(e.Name())...)
		}
	}
	return removed, nil
}

// removeStaging removes app's staging folders that no install holds.
func (s *Store) removeStaging(app string) []string {
	tmps, _ := filepath.Glob(filepath.Join(s.Dir, app, tmpPrefix+"*"))
	var removed []string
	for _, t := range tmps {
		l, err := lockStaging(t, false)
		if err != nil {
			continue // held by an install, or gone
		}
		if os.RemoveAll(t) == nil {
			removed = append(removed, t)
		}
		l.Close()
	}
	return removed
}

// lockStaging takes the lock an install holds on its staging folder for
// as long as it runs (an flock, released when its process dies), waiting
// for it when wait is set.
func lockStaging(dir string, wait bool) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
