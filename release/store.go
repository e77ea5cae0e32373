// Package release keeps the releases of apps on disk: it installs an
// artifact (from a path, or from a file the client opened and passed),
// verifies its checksum, and keeps the history for rollback and pruning.
// It never starts processes; the agent's own binary is release/selfupdate's.
package release

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Kinds of artifact.
const (
	KindFile    = "file"   // one executable
	KindDir     = "dir"    // a folder, copied
	KindTarball = "tar.gz" // extracted
	// metaFile is reserved in artifacts: the name of the record in a
	// release folder before the records moved to the agent's place.
	metaFile    = legacyRecord
	tmpPrefix   = ".tmp-"
	maxVersion  = 128
	shortSHALen = 12
)

var versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// Release is one installed version of an app.
type Release struct {
	App         string    `json:"app"`
	Version     string    `json:"version"`
	InstalledAt time.Time `json:"installed_at"`
	SHA256      string    `json:"sha256"`
	Size        int64     `json:"size"`
	Kind        string    `json:"kind"`
	Artifact    string    `json:"artifact"` // where it was installed from
	// Path is the release folder; Created is set by the Install that
	// created it (neither is stored).
	Path    string `json:"-"`
	Created bool   `json:"-"`
}

// Store keeps releases under Dir/APP/VERSION. Not safe for concurrent
// installs of one app; the agent serializes operations per app.
type Store struct {
	Dir string
}

// Path is the folder of app's version.
func (s *Store) Path(app, version string) string {
	return filepath.Join(s.Dir, app, version)
}

// Install verifies artifact (sha256 when wantSHA is set) and installs it as
// app's version (default: the first 12 hex digits of its sha256). Installing
// the same content under an existing version is a no-op; other content
// under an existing version is refused. On error nothing is left behind.
func (s *Store) Install(app, artifact, version, wantSHA string) (*Release, error) {
	fi, err := os.Stat(artifact)
	if err != nil {
		p := Unreadable
		if errors.Is(err, fs.ErrNotExist) {
			p = NotFound
		}
		return nil, refuse(p, "%v", err)
	}
	kind := KindFile
	switch {
	case fi.IsDir():
		kind = KindDir
	case !fi.Mode().IsRegular(): // a FIFO would hold the app's lock until written
		return nil, refuse(NotRegular, "%s is neither a file, a folder nor a .tar.gz", artifact)
	case strings.HasSuffix(artifact, ".tar.gz") || strings.HasSuffix(artifact, ".tgz"):
		kind = KindTarball
	case fi.Mode()&0o111 == 0:
		return nil, refuse(NotExecutable, "%s is not executable", artifact)
	}
	sum, size, err := digest(artifact, kind)
	if err != nil {
		return nil, refuse(Unreadable, "read %s: %v", artifact, err)
	}
	if wantSHA != "" && !strings.EqualFold(strings.TrimSpace(wantSHA), sum) {
		return nil, refuse(ChecksumMismatch, "sha256 mismatch: %s has %s, expected %s", artifact, sum, wantSHA)
	}
	if version == "" {
		version = sum[:shortSHALen]
	}
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	if old, err := s.existing(app, version, sum); err != nil || old != nil {
		return old, err
	}
	tmp, cleanup, err := s.stage(app)
	if err != nil {
		return nil, err
	}
	defer cleanup() // a no-op for the folder after the rename
	if err := unpack(artifact, kind, tmp); err != nil {
		return nil, refuse(Unpack, "%v", err)
	}
	rel := &Release{App: app, Version: version, InstalledAt: time.Now().UTC(), SHA256: sum, Size: size,
		Kind: kind, Artifact: artifact, Path: s.Path(app, version)}
	if err := s.commit(tmp, rel); err != nil {
		return nil, err
	}
	return rel, nil
}

// commit makes the staged folder tmp the release rel: the record first,
// then one rename, so that a crash leaves either a record without its
// folder (not a release; the next install of that version overwrites it)
// or a complete release.
func (s *Store) commit(tmp string, rel *Release) error {
	if err := s.writeRecord(rel); err != nil {
		return err
	}
	if err := os.Rename(tmp, rel.Path); err != nil {
		s.removeRecord(rel.App, rel.Version)
		return fmt.Errorf("install %s: %w", rel.Path, err)
	}
	syncDir(filepath.Dir(rel.Path))
	rel.Created = true
	return nil
}

func (s *Store) tempDir(app string) (string, error) {
	parent := filepath.Join(s.Dir, app)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("releases folder: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	tmp := filepath.Join(parent, tmpPrefix+hex.EncodeToString(b[:]))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", fmt.Errorf("releases folder: %w", err)
	}
	return tmp, nil
}

func unpack(artifact, kind, dst string) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	switch kind {
	case KindFile:
		return copyFile(root, artifact, filepath.Base(artifact))
	case KindDir:
		return copyTree(artifact, root)
	default:
		f, err := os.Open(artifact)
		if err != nil {
			return err
		}
		defer f.Close()
		return Extract(f, dst)
	}
}

// Get returns app's version; a version that is not a safe folder name is
// refused (a *RefusedError with BadVersion) before anything is read.
func (s *Store) Get(app, version string) (*Release, error) {
	r, err := s.read(app, version)
	var re *RefusedError
	if errors.As(err, &re) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("release %s of %s: %w", version, app, err)
	}
	return r, nil
}

// List returns app's releases, newest first.
func (s *Store) List(app string) ([]*Release, error) {
	ents, err := os.ReadDir(filepath.Join(s.Dir, app))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Release
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if r, err := s.read(app, e.Name()); err == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstalledAt.After(out[j].InstalledAt) })
	return out, nil
}

// Prune removes the oldest releases of app beyond keep, never one named in
// protect. It also removes leftovers of interrupted installs.
func (s *Store) Prune(app string, keep int, protect ...string) ([]string, error) {
	rs, err := s.List(app)
	if err != nil {
		return nil, err
	}
	s.removeStaging(app)
	var removed []string
	kept := 0
	for _, r := range rs {
		isProtected := false
		for _, p := range protect {
			isProtected = isProtected || p == r.Version
		}
		if isProtected || kept < keep {
			kept++
			continue
		}
		if err := os.RemoveAll(r.Path); err != nil {
			return removed, err
		}
		s.removeRecord(app, r.Version)
		removed = append(removed, r.Version)
	}
	return removed, nil
}

// digest is the sha256 of a file, or of a folder's content (paths, modes,
// link targets and file contents, in order) and its size in bytes.
func digest(path, kind string) (string, int64, error) {
	h := sha256.New()
	var size int64
	if kind != KindDir {
		f, err := os.Open(path)
		if err != nil {
			return "", 0, err
		}
		defer f.Close()
		n, err := io.Copy(h, f)
		return hex.EncodeToString(h.Sum(nil)), n, err
	}
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(path, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%o\x00", filepath.ToSlash(rel), info.Mode())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00", target)
		case info.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(h, f)
			f.Close()
			size += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), size, err
}

// syncDir makes renames in dir durable.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
