package release

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Source is an artifact the client opened itself and passed to the agent
// as an open file, so the agent reads only what the client could read.
type Source struct {
	File *os.File
	// Kind is KindFile (an executable), KindTarball (a .tar.gz) or
	// KindDir: an uncompressed tar stream of a folder, its entries in
	// filepath.WalkDir order, the folder itself first as ".".
	Kind string
	Name string // the artifact's base name; a KindFile is installed under it
	// Idle is how long a read waits for the client's next bytes (0:
	// DefaultStreamIdle); File should be Pollable for it to apply.
	Idle time.Duration
}

// Install verifies and installs src as app's version, as Install does for
// a path. The artifact is staged in a temporary folder beside the releases
// and hashed while it is read; it becomes a release only once verified. On
// error nothing is left behind under the store.
func (s *Store) InstallFrom(app string, src Source, version, wantSHA string) (*Release, error) {
	if version != "" {
		if err := checkVersion(version); err != nil {
			return nil, err
		}
	}
	if err := checkSource(src); err != nil {
		return nil, err
	}
	tmp, cleanup, err := s.stage(app)
	if err != nil {
		return nil, err
	}
	defer cleanup() // a no-op for the folder once renamed
	sum, size, err := unpackFrom(src, tmp)
	var re *RefusedError
	if errors.As(err, &re) && (re.Problem == Stalled || re.Problem == TooLarge) {
		return nil, re
	}
	if err != nil {
		return nil, refuse(Unpack, "%v", err)
	}
	if wantSHA != "" && !strings.EqualFold(strings.TrimSpace(wantSHA), sum) {
		return nil, refuse(ChecksumMismatch, "sha256 mismatch: %s has %s, expected %s", src.Name, sum, wantSHA)
	}
	if version == "" {
		version = sum[:shortSHALen]
	}
	if old, err := s.existing(app, version, sum); err != nil || old != nil {
		return old, err
	}
	rel := &Release{App: app, Version: version, InstalledAt: time.Now().UTC(), SHA256: sum, Size: size,
		Kind: src.Kind, Artifact: src.Name, Path: s.Path(app, version)}
	if err := s.commit(tmp, rel); err != nil {
		return nil, err
	}
	return rel, nil
}

func checkSource(src Source) error {
	name := src.Name
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." || name == metaFile {
		return refuse(BadName, "artifact name %q: a file name without folders, not %s", name, metaFile)
	}
	fi, err := src.File.Stat()
	if err != nil {
		return refuse(Unreadable, "%s: %v", name, err)
	}
	switch src.Kind {
	case KindFile:
		if !fi.Mode().IsRegular() {
			return refuse(NotRegular, "%s is neither a file, a folder nor a .tar.gz", name)
		}
		if fi.Mode()&0o111 == 0 {
			return refuse(NotExecutable, "%s is not executable", name)
		}
	case KindTarball, KindDir:
	default:
		return refuse(BadKind, "artifact kind %q: use %s, %s or %s", src.Kind, KindFile, KindTarball, KindDir)
	}
	return nil
}

// stage makes the temporary folder of an install; cleanup removes it and
// the app's releases folder if stage created it and it is empty again.
func (s *Store) stage(app string) (string, func(), error) {
	parent := filepath.Join(s.Dir, app)
	_, err := os.Stat(parent)
	newParent := err != nil
	_, err = os.Stat(s.Dir)
	newStore := err != nil
	tmp, err := s.tempDir(app)
	if err != nil {
		return "", nil, err
	}
	// Held until the install ends, so that another agent (starting during
	// an upgrade) does not take it for a leftover.
	lock, err := lockStaging(tmp, true)
	if err != nil {
		os.Remove(tmp)
		return "", nil, fmt.Errorf("releases folder: %w", err)
	}
	return tmp, func() {
		defer lock.Close()
		os.RemoveAll(tmp)
		if newParent {
			os.Remove(parent) // only if empty: not after a rename into it
		}
		if newStore {
			os.Remove(s.Dir)
		}
	}, nil
}

// existing returns the release app/version when it holds sum already, and
// a refusal when it holds other content or is not a release.
func (s *Store) existing(app, version, sum string) (*Release, error) {
	if old, err := s.read(app, version); err == nil {
		if old.SHA256 != sum {
			return nil, refuse(VersionExists, "version %s of %s already exists with other content (sha256 %s, this one %s)",
				version, app, old.SHA256, sum)
		}
		return old, nil
	}
	if _, err := os.Lstat(s.Path(app, version)); err == nil {
		return nil, refuse(VersionExists, "%s exists but is not a release deployd installed", s.Path(app, version))
	}
	return nil, nil
}

// unpackFrom writes src into dst and returns its digest and size.
func unpackFrom(src Source, dst string) (string, int64, error) {
	h := sha256.New()
	in := newStreamReader(src.File, src.Idle)
	switch src.Kind {
	case KindFile:
		root, err := os.OpenRoot(dst)
		if err != nil {
			return "", 0, err
		}
		defer root.Close()
		fi, err := src.File.Stat()
		if err != nil {
			return "", 0, err
		}
		cr := &countReader{r: io.TeeReader(in, h)}
		if err := writeEntry(root, cr, src.Name, fi.Mode().Perm()); err != nil {
			return "", 0, err
		}
		return hex.EncodeToString(h.Sum(nil)), cr.n, nil
	case KindTarball:
		cr := &countReader{r: io.TeeReader(in, h)}
		if err := Extract(cr, dst); err != nil {
			return "", 0, err
		}
		if _, err := io.Copy(io.Discard, cr); err != nil { // the rest counts too
			return "", 0, err
		}
		return hex.EncodeToString(h.Sum(nil)), cr.n, nil
	}
	dh := &dirHash{Hash: h}
	if err := extract(tar.NewReader(bufio.NewReaderSize(in, 64<<10)), dst, dh, nil); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), dh.size, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// dirHash hashes a folder's tar stream as digest hashes the folder.
type dirHash struct {
	hash.Hash
	size int64
}

// hashEntry adds h to dig the way digest does for a folder entry and
// returns the entry's body, hashed as it is read.
func hashEntry(dig hash.Hash, h *tar.Header, body io.Reader) io.Reader {
	name := path.Clean(strings.TrimPrefix(h.Name, "./"))
	mode := h.FileInfo().Mode()
	fmt.Fprintf(dig, "%s\x00%o\x00", name, mode)
	switch {
	case mode&fs.ModeSymlink != 0:
		fmt.Fprintf(dig, "%s\x00", h.Linkname)
	case mode.IsRegular():
		if dh, ok := dig.(*dirHash); ok {
			dh.size += h.Size
		}
		return io.TeeReader(body, dig)
	}
	return body
}
