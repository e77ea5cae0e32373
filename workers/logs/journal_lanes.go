package logs

import (
	"crypto/sha256"
	"encoding/binary"
)

// The lanes of a Journal: the progress of each place a stream's lines go
// to (the files, and for target = "both" the systemd journal too).

// readBlock reads a lane's block of the header.
func readBlock(h []byte) lane {
	l := lane{done: int64(binary.LittleEndian.Uint64(h[4:]))}
	if h[12] == 1 {
		rec := &Append{}
		rec.Dev = binary.LittleEndian.Uint64(h[13:])
		rec.Ino = binary.LittleEndian.Uint64(h[21:])
		rec.Off = int64(binary.LittleEndian.Uint64(h[29:]))
		rec.Len = int64(binary.LittleEndian.Uint64(h[37:]))
		copy(rec.Sum[:], h[45:45+sha256.Size])
		rec.Upto = int64(binary.LittleEndian.Uint64(h[45+sha256.Size:]))
		l.rec = rec
	}
	return l
}

// putBlock writes lane l's block of the header.
func putBlock(h []byte, magic uint32, l lane) {
	binary.LittleEndian.PutUint32(h[0:], magic)
	binary.LittleEndian.PutUint64(h[4:], uint64(l.done))
	if rec := l.rec; rec != nil {
		h[12] = 1
		binary.LittleEndian.PutUint64(h[13:], rec.Dev)
		binary.LittleEndian.PutUint64(h[21:], rec.Ino)
		binary.LittleEndian.PutUint64(h[29:], uint64(rec.Off))
		binary.LittleEndian.PutUint64(h[37:], uint64(rec.Len))
		copy(h[45:], rec.Sum[:])
		binary.LittleEndian.PutUint64(h[45+sha256.Size:], uint64(rec.Upto))
	}
}

// base is the lowest done offset of the lanes in use: the bytes before it
// are in every place.
func (j *Journal) base() int64 {
	b := j.lanes[0].done
	for _, l := range j.lanes[1:j.n] {
		b = min(b, l.done)
	}
	return b
}

// top is the highest done offset of the lanes in use.
func (j *Journal) top() int64 {
	t := j.lanes[0].done
	for _, l := range j.lanes[1:j.n] {
		t = max(t, l.done)
	}
	return t
}

// use sets how many lanes are in use: a lane taken up starts where lane 0
// is (the place is new: it gets the lines from now on); a lane let go
// (the stream goes to one place now) is forgotten, with the append it may
// have recorded.
func (j *Journal) use(n int) error {
	if n == j.n {
		return nil
	}
	j.mu.Lock()
	if n > j.n {
		j.lanes[1] = lane{done: j.lanes[0].done}
	} else {
		j.lanes[1] = lane{}
	}
	j.n = n
	err := j.writeHeader()
	j.mu.Unlock()
	j.trim()
	return err
}

// trim lets go of the pending bytes every lane is done with.
func (j *Journal) trim() {
	b := j.base()
	if k := b - j.pbase; k > 0 {
		j.pending = j.pending[:copy(j.pending, j.pending[k:])]
		j.pbase = b
	}
}

// settlerOf is the Sink that can tell where rec went: the one of its kind
// (the journal or a file), whichever lane it now is, for a stream whose
// target changed; else lane i's; nil when there is none.
func settlerOf(rec *Append, sinks []*Sink, i int) *Sink {
	for _, s := range sinks {
		if s != nil && s.toJournal() == (rec.Dev == journaldDev) {
			return s
		}
	}
	if i < len(sinks) {
		return sinks[i]
	}
	return nil
}
