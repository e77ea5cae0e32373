package logs

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/safeopen"
)

// File is the file end of a Sink: the current log file and its rotation.
// A Sink's writer goroutine is its only user, so implementations need not be
// safe for concurrent use. Tests inject their own through Options.Open.
type File interface {
	// Write appends whole lines (p always ends in '\n').
	Write(p []byte) (int, error)
	// Rotate moves the current file aside by renaming it and starts a new one.
	Rotate() error
	// Truncate empties the log: the current file and the rotated ones.
	Truncate() error
	Close() error
}

// Rotated files are named like lumberjack's, so existing tooling still matches:
// web.out.log is rotated to web.out-2026-11-30T03-22-48.123.log, which sorts
// by rotation time (UTC) and becomes web.out-2026-11-30T03-22-48.123.log.gz
// when compressed.
const (
	backupTimeLayout = "2006-01-02T15-04-05.000"
	gzSuffix         = ".gz"
	tmpSuffix        = ".tmp"
)

// rotator is the default File. It is written here rather than taken from
// lumberjack v2.2.1 because lumberjack (a) sizes files in whole megabytes,
// (b) never stops its compression goroutine, so every closed Sink would leak
// one (natefinch/lumberjack#56, #205), and (c) silently overwrites a rotated
// file when two rotations fall in the same millisecond (#34), losing lines.
// It keeps lumberjack's rename-based rotation and its file names.
//
// Every file is opened, renamed and removed relative to the log folder held
// open (dir), never following a link: a log folder an app's user could
// write must not let it point root's writes at another file (issue 39).
//
// Owned by the Sink's writer goroutine; the mill goroutine, which compresses
// and prunes rotated files, only ever touches rotated files.
type rotator struct {
	path, base, prefix, ext string
	dir                     *safeopen.Dir
	maxSize                 int64
	log                     hclog.Logger

	f         *os.File // nil after a failed rotation; reopened by Write
	size      int64
	lastStamp time.Time // of the newest rotated file; names stay unique

	millc    chan chan struct{} // kick the mill; a non-nil chan is closed when it is idle
	millDone chan struct{}
}

func newRotator(o Options) (File, error) {
	dir := filepath.Dir(o.Path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		_ = os.Chmod(dir, 0o755) // whatever the umask
	}
	d, err := safeopen.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("log folder: %w", err)
	}
	base := filepath.Base(o.Path)
	ext := filepath.Ext(base)
	r := &rotator{
		path:     o.Path,
		base:     base,
		dir:      d,
		prefix:   strings.TrimSuffix(base, ext) + "-",
		ext:      ext,
		maxSize:  o.MaxSize,
		log:      o.Logger,
		millc:    make(chan chan struct{}, 1),
		millDone: make(chan struct{}),
	}
	if err := r.open(); err != nil {
		d.Close()
		return nil, err
	}
	m := mill{r: r, maxFiles: o.MaxFiles, maxAge: o.MaxAge, compress: o.Compress}
	go m.run()
	r.kick() // apply MaxFiles/MaxAge/Compress to what a previous run left
	return r, nil
}

// open opens (or creates, mode 0640) the current file for appending; a
// link, a FIFO or a device in its place is refused, not written through.
func (r *rotator) open() error {
	existed := r.dir.Exists(r.base)
	f, err := r.dir.OpenFile(r.base, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	if !existed {
		_ = f.Chmod(0o640) // whatever the umask
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// Write writes p, rotating first whenever the next lines would take the file
// past maxSize. It rotates between lines, so a line is never split across
// files; a single line longer than maxSize gets a file to itself.
func (r *rotator) Write(p []byte) (int, error) {
	if r.f == nil {
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	total := 0
	for len(p) > 0 {
		chunk := p
		if r.size+int64(len(p)) > r.maxSize {
			room := max(r.maxSize-r.size, 0)
			i := bytes.LastIndexByte(p[:room], '\n')
			if i < 0 && r.size > 0 {
				if err := r.Rotate(); err != nil {
					return total, fmt.Errorf("rotate: %w", err)
				}
				continue
			}
			if i < 0 { // one line longer than maxSize, in an empty file
				i = bytes.IndexByte(p, '\n')
				if i < 0 {
					i = len(p) - 1
				}
			}
			chunk = p[:i+1]
		}
		n, err := r.f.Write(chunk)
		r.size += int64(n)
		total += n
		if err != nil {
			return total, err
		}
		p = p[n:]
	}
	return total, nil
}

// Rotate renames the current file to a unique timestamped name and opens a
// new one. Nothing is copied, so nothing written meanwhile can be lost.
func (r *rotator) Rotate() error {
	if r.f != nil {
		err := r.f.Close()
		r.f = nil
		if err != nil {
			return err
		}
	}
	if err := r.dir.Rename(r.base, r.backupName()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Keep writing to the old file rather than nowhere.
		return errors.Join(err, r.open())
	}
	if err := r.open(); err != nil {
		return err
	}
	r.kick()
	return nil
}

// backupName returns an unused name (in r.dir) for the current file: the rotation time,
// bumped by a millisecond if a file of that name exists or if rotations come
// faster than one per millisecond.
func (r *rotator) backupName() string {
	t := time.Now().UTC().Truncate(time.Millisecond)
	if !t.After(r.lastStamp) {
		t = r.lastStamp.Add(time.Millisecond)
	}
	for {
		name := r.prefix + t.Format(backupTimeLayout) + r.ext
		if !r.dir.Exists(name) && !r.dir.Exists(name+gzSuffix) {
			r.lastStamp = t
			return name
		}
		t = t.Add(time.Millisecond)
	}
}

// Truncate empties the log: it replaces the current file with a new, empty
// one (rather than truncating it in place, so that a Follow notices even if
// new lines make the file longer than what it had read) and removes every
// rotated file.
func (r *rotator) Truncate() error {
	var errs []error
	if r.f != nil {
		errs = append(errs, r.f.Close())
		r.f = nil
	}
	if err := r.dir.Remove(r.base); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, r.open())
	r.waitMill() // so it is not compressing a file we remove
	backups, err := listBackupsIn(r.dir, r.base)
	errs = append(errs, err)
	for _, b := range backups {
		if err := r.dir.Remove(b.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close closes the current file and stops the mill, waiting for it.
func (r *rotator) Close() error {
	var err error
	if r.f != nil {
		err = r.f.Close()
		r.f = nil
	}
	close(r.millc)
	<-r.millDone
	return errors.Join(err, r.dir.Close())
}

func (r *rotator) kick() {
	select {
	case r.millc <- nil:
	default: // a run is already pending; it will see the new file
	}
}

// waitMill returns once the mill has finished a full run after the call.
func (r *rotator) waitMill() {
	idle := make(chan struct{})
	r.millc <- idle
	<-idle
}

// mill compresses and prunes rotated files, off the writer goroutine so a
// slow gzip never holds up the log. Owned by its run goroutine, which
// rotator.Close waits for.
type mill struct {
	r        *rotator
	maxFiles int
	maxAge   time.Duration
	compress bool
}

func (m mill) run() {
	defer close(m.r.millDone)
	for idle := range m.r.millc {
		if err := m.once(); err != nil {
			m.r.log.Warn("rotated log files", "path", m.r.path, "error", err)
		}
		if idle != nil {
			close(idle)
		}
	}
}

func (m mill) once() error {
	backups, err := listBackupsIn(m.r.dir, m.r.base)
	if err != nil {
		return err
	}
	var errs []error
	cutoff := time.Now().Add(-m.maxAge)
	for i, b := range backups {
		if (m.maxFiles > 0 && i >= m.maxFiles) || (m.maxAge > 0 && b.stamp.Before(cutoff)) {
			if err := m.r.dir.Remove(b.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if m.compress && !b.gz {
			if err := compressIn(m.r.dir, b.name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// compressFile compresses the rotated file at path (compressIn), opening
// its folder without following a link.
func compressFile(path string) error {
	d, err := safeopen.OpenDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer d.Close()
	return compressIn(d, filepath.Base(path))
}

// compressIn gzips name to name.gz (in d) through a temporary file, so a
// reader never sees a partial .gz, then removes name.
func compressIn(d *safeopen.Dir, name string) (err error) {
	src, err := d.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	tmp := name + gzSuffix + tmpSuffix
	dst, err := d.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer func() {
		if err != nil {
			dst.Close()
			d.Remove(tmp)
		}
	}()
	zw := gzip.NewWriter(dst)
	if _, err := io.Copy(zw, src); err != nil {
		return fmt.Errorf("compress %s: %w", name, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress %s: %w", name, err)
	}
	if err := dst.Close(); err != nil {
		return fmt.Errorf("compress %s: %w", name, err)
	}
	if err := d.Rename(tmp, name+gzSuffix); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	return d.Remove(name)
}

// backup is one rotated file of a log.
type backup struct {
	path  string    // in the folder it was listed in
	name  string    // the file's name in that folder
	stamp time.Time // rotation time, from the name
	gz    bool
}

// listBackups returns the rotated files of the log at path, newest first
// (listBackupsIn), opening its folder without following a link.
func listBackups(path string) ([]backup, error) {
	d, err := safeopen.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("list rotated files: %w", err)
	}
	defer d.Close()
	return listBackupsIn(d, filepath.Base(path))
}

// listBackupsIn returns the rotated files of the log named base in d,
// newest first. If both x and x.gz exist (compression was interrupted),
// x.gz is complete (it is renamed into place) and x is listed, not x.gz.
func listBackupsIn(d *safeopen.Dir, base string) ([]backup, error) {
	ext := filepath.Ext(base)
	prefix := strings.TrimSuffix(base, ext) + "-"
	entries, err := d.ReadDir()
	if err != nil {
		return nil, fmt.Errorf("list rotated files: %w", err)
	}
	seen := make(map[string]bool)
	var out []backup
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) { // a link is never ours
			continue
		}
		gz := strings.HasSuffix(name, ext+gzSuffix)
		stem := strings.TrimSuffix(name, gzSuffix)
		if !strings.HasSuffix(stem, ext) {
			continue
		}
		stamp, err := time.Parse(backupTimeLayout, strings.TrimSuffix(stem[len(prefix):], ext))
		if err != nil || seen[stem] {
			continue
		}
		if gz && d.Exists(stem) {
			continue // listed as the uncompressed file
		}
		seen[stem] = true
		out = append(out, backup{path: filepath.Join(d.Path(), name), name: name, stamp: stamp, gz: gz})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stamp.After(out[j].stamp) })
	return out, nil
}
