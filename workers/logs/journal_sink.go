package logs

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/deployd/deployd/internal/safeopen"
)

// positioner is a File that can tell where the next write goes, rotating
// first if n bytes would take it past its size limit, so that the write
// lands in that file whole. The default File (rotator) is one; a File
// that is not gets its journals' lines written without a record.
type positioner interface {
	position(n int) (FilePos, error)
	// writeWhole appends p to the file position told, without rotating.
	writeWhole(p []byte) (int, error)
}

// appendJournaled writes r's lines after what is queued, recording the
// write in r's journal first.
func (w *writer) appendJournaled(r request) error {
	_ = w.take()
	_ = w.flush()
	for i := range r.lines {
		w.app = r.lines[i].App
		w.buf = appendLine(w.buf, w.opts.Format, &r.lines[i])
	}
	w.journal, w.lane, w.upto = r.journal, r.lane, r.upto
	err := w.flush()
	w.journal = nil
	return err
}

// writeRecorded writes data as w.f.Write does, first recording the append
// in w.journal; the append then goes to the recorded file whole, even past
// its size limit (by at most one batch: the lines of spliceMax bytes of a
// worker's output), so that a file never holds part of it.
func (w *writer) writeRecorded(data []byte) (int, error) {
	p, ok := w.f.(positioner)
	if !ok {
		return w.f.Write(data)
	}
	pos, err := p.position(len(data))
	if err == nil {
		err = w.journal.record(w.lane, pos, data, w.upto)
	}
	if err != nil {
		w.log.Warn("cannot record an append in the worker's journal: an agent crash now may repeat its lines", "error", err)
		return w.f.Write(data)
	}
	return p.writeWhole(data)
}

// resolve tells whether rec's bytes are in the log: in the current file or
// a rotated one that is not compressed yet, at rec's offset, hashing alike.
// A file of rec's that is gone (rotated and compressed or pruned) was
// rotated after the append, so the append happened. A write torn at the end
// of the current file (the dying agent was in it) is cut off. A file holds
// an append whole or not at all; the journal may hold its first lines
// (journald.resolve).
func (w *writer) resolve(rec *Append) Found {
	if jd, ok := w.f.(*journald); ok && rec.Dev == journaldDev {
		return jd.resolve(rec)
	}
	paths := []string{w.opts.Path}
	if bs, err := listBackups(w.opts.Path); err == nil {
		for _, b := range bs {
			if !b.gz {
				paths = append(paths, b.path)
			}
		}
	}
	for _, path := range paths {
		f, err := safeopen.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		in := appendIn(f, rec)
		if in == torn { // nothing was written after it: cut it off
			if err := f.Truncate(rec.Off); err != nil {
				w.log.Warn("cannot cut off a torn write", "error", err)
			}
		}
		f.Close()
		if in == notThisFile {
			continue
		}
		return Found{All: in == present}
	}
	return Found{All: true}
}

// Found is how much of an append that a dead agent recorded is in the log
// (Sink.Resolve): all of it, or else its first Lines lines (0: none).
type Found struct {
	All   bool
	Lines int // the worker's lines, not the Sink's marker lines
}

// Where an append is (appendIn).
type appendState int

const (
	notThisFile appendState = iota // the file is not the append's
	present                        // its bytes are there
	absent                         // other bytes (or none) are there
	torn                           // the file ends within them
)

// appendIn tells whether f holds rec's bytes.
func appendIn(f *os.File, rec *Append) appendState {
	st, err := f.Stat()
	if err != nil {
		return notThisFile
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || uint64(sys.Dev) != rec.Dev || sys.Ino != rec.Ino {
		return notThisFile
	}
	switch size := st.Size(); {
	case size <= rec.Off:
		return absent
	case size < rec.Off+rec.Len:
		return torn
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, rec.Off, rec.Len)); err != nil {
		return absent
	}
	if !bytes.Equal(h.Sum(nil), rec.Sum[:]) {
		return absent
	}
	return present
}

func (r *rotator) writeWhole(p []byte) (int, error) {
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// position rotates first if n more bytes would take the file past maxSize
// (and it is not empty), then tells the file and its size.
func (r *rotator) position(n int) (FilePos, error) {
	if r.f == nil {
		if err := r.open(); err != nil {
			return FilePos{}, err
		}
	}
	if r.size > 0 && r.size+int64(n) > r.maxSize {
		if err := r.Rotate(); err != nil {
			return FilePos{}, err
		}
	}
	st, err := r.f.Stat()
	if err != nil {
		return FilePos{}, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return FilePos{}, errors.New("no device and inode")
	}
	r.size = st.Size()
	return FilePos{Dev: uint64(sys.Dev), Ino: sys.Ino, Size: r.size}, nil
}
