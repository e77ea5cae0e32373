package release

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/deployd/deployd/internal/atomicfile"
	"github.com/deployd/deployd/internal/boundedfile"
)

// The agent's record of a release lives in Dir/APP/.records/VERSION.json,
// a folder only the agent writes: the release folder itself is given to the
// app's user when the app has a before hook, and root never trusts a file
// that user can write. Releases installed before the records moved hold
// their record in the release folder (legacyRecord); it is read once,
// bounded, checked and copied to the agent's place.
const (
	recordsDir   = ".records"
	legacyRecord = ".deployd-release.json"
	// maxRecord bounds a record (one is a few hundred bytes).
	maxRecord = 64 << 10
)

// recordPath is where the agent keeps the record of app's version.
func (s *Store) recordPath(app, version string) string {
	return filepath.Join(s.Dir, app, recordsDir, version+".json")
}

// writeRecord records rel, atomically, in the agent's place.
func (s *Store) writeRecord(rel *Release) error {
	b, err := json.MarshalIndent(rel, "", "  ")
	if err != nil {
		return err
	}
	p := s.recordPath(rel.App, rel.Version)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("record release: %w", err)
	}
	if err := atomicfile.WriteFileNoSymlinks(p, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record release: %w", err)
	}
	return nil
}

// removeRecord removes the record of app's version (and the records
// folder once empty).
func (s *Store) removeRecord(app, version string) {
	p := s.recordPath(app, version)
	os.Remove(p)
	os.Remove(filepath.Dir(p)) // only if empty
}

// read returns app's version: a folder of the store (not a link) with the
// agent's record of it. A version that is not a safe folder name is refused
// before anything is opened.
func (s *Store) read(app, version string) (*Release, error) {
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	dir := s.Path(app, version)
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a folder deployd installed", dir)
	}
	b, err := boundedfile.ReadFile(s.recordPath(app, version), boundedfile.Options{Max: maxRecord, NoSymlinks: true})
	migrate := errors.Is(err, fs.ErrNotExist)
	if migrate {
		b, err = boundedfile.ReadFile(filepath.Join(dir, legacyRecord), boundedfile.Options{Max: maxRecord, NoSymlinks: true})
	}
	if err != nil {
		return nil, err
	}
	var r Release
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("record of %s: %w", dir, err)
	}
	if r.App != app || r.Version != version {
		return nil, fmt.Errorf("record of %s names %s %s", dir, r.App, r.Version)
	}
	r.Path = dir
	if migrate {
		if err := s.writeRecord(&r); err != nil {
			return nil, err
		}
	}
	return &r, nil
}
