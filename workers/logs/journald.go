package logs

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/hashicorp/go-hclog"
)

// A Sink whose Target is TargetJournal writes every line as an entry of the
// systemd journal, through journald's native protocol (go-systemd's journal
// package: a datagram to /run/systemd/journal/socket, or a file passed
// along with it for an entry too large for one). Its File is a journald:
// the writer formats lines as frames (formatJournald) and the journald
// sends one entry per frame, so the Sink's queue, backpressure, drop
// markers and the output journal's commit protocol are the files' own.
//
// Exactly once across an agent SIGKILL: every entry of a recorded append
// carries DEPLOYD_APPEND (the append's SHA-256, shortened) and
// DEPLOYD_APPEND_N (how many entries the append sends). The agent that
// comes next settles the append by counting its entries in the journal
// (journalctl), after it has seen an entry of its own appear there: the
// journal socket is one queue, so what the dead agent sent before it died
// is in the journal by then. All of them there: the append happened; none:
// it did not; the first k (datagrams of one socket arrive in order): the
// worker's journal marks the lines of those k as done at once, in its
// header, and the rest is sent as a new append. Nothing of the settling is
// kept only in the agent's memory, so an agent killed right after it
// settled leaves the next one the same facts.

// journaldDev is the device of the FilePos of an append to the journal:
// no file system has it.
const journaldDev = ^uint64(0)

// journaldConn is how a journald reaches journald: the real one sends with
// go-systemd and reads with journalctl; tests use a fake.
type journaldConn interface {
	Send(msg string, prio journal.Priority, vars map[string]string) error
	// Count returns the entries whose field is value (at most a bound),
	// each as its DEPLOYD_APPEND_N and DEPLOYD_STREAM.
	Count(field, value string) ([]appendEntry, error)
}

// appendEntry is what resolve reads of an entry of an append.
type appendEntry struct {
	N      int
	Stream string
}

// journald is the File of a TargetJournal Sink; owned by its writer.
type journald struct {
	conn    journaldConn
	sent    int64             // bytes of frames sent: the FilePos size of the next append
	settled bool              // the barrier entry was seen
	id      string            // DEPLOYD_APPEND of the append being written
	vars    map[string]string // reused for every entry
	log     hclog.Logger
	// progress, when set, gets the time of each entry sent (every
	// progressEvery): the Sink's busySince (writer.setFile).
	progress *atomic.Int64
}

// progressEvery is how many entries Write sends between two notes of its
// progress.
const progressEvery = 64

// newJournaldConn is the conn of the journald Files a Sink opens; tests
// replace it.
var newJournaldConn = func() journaldConn { return systemJournal{} }

// journalEnabled tells whether journald's socket is there; tests replace it.
var journalEnabled = journal.Enabled

func newJournald(o Options) (File, error) {
	if !journalEnabled() {
		return nil, errors.New("the systemd journal's socket (/run/systemd/journal/socket) is not there; " +
			`is journald running? or set [apps.NAME.logs] target = "files"`)
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &journald{conn: newJournaldConn(), vars: map[string]string{}, log: log}, nil
}

// Write sends one entry per frame of p. It returns how many bytes of p
// were sent whole, and the first error.
func (j *journald) Write(p []byte) (int, error) {
	n, sent := 0, 0
	for len(p) > n {
		end := bytes.IndexByte(p[n:], '\n')
		if end < 0 {
			return n, errors.New("logs: journald: a frame without its newline")
		}
		if err := j.send(p[n : n+end]); err != nil {
			return n, fmt.Errorf("logs: journald: %w", err)
		}
		n += end + 1
		if sent++; sent%progressEvery == 0 && j.progress != nil {
			j.progress.Store(time.Now().UnixNano())
		}
	}
	j.sent += int64(n)
	return n, nil
}

func (j *journald) Rotate() error   { return nil } // journald rotates its own files
func (j *journald) Truncate() error { return nil } // and vacuums them (journalctl --vacuum-*)
func (j *journald) Close() error    { return nil }

// position is where the next append goes: the journal, and a count that
// differs from the last append's.
func (j *journald) position(int) (FilePos, error) {
	return FilePos{Dev: journaldDev, Size: j.sent}, nil
}

// writeWhole sends a recorded append, its entries tagged with its id.
func (j *journald) writeWhole(p []byte) (int, error) {
	sum := sha256.Sum256(p)
	j.id = hex.EncodeToString(sum[:appendIDLen])
	defer func() { j.id = "" }()
	n := 0
	for f := range bytes.Lines(p) {
		if _, ok := parseFrame(f[:len(f)-1]); ok {
			n++
		}
	}
	j.vars["DEPLOYD_APPEND_N"] = strconv.Itoa(n)
	defer delete(j.vars, "DEPLOYD_APPEND_N")
	return j.Write(p)
}

// appendIDLen is how many bytes of an append's SHA-256 its id shows.
const appendIDLen = 12

// send sends the entry of one frame.
func (j *journald) send(frame []byte) error {
	fr, ok := parseFrame(frame)
	if !ok {
		return nil // the newline that ends a partial write: none here
	}
	prio, msg := linePriority(fr.stream, fr.text)
	v := j.vars
	v["SYSLOG_IDENTIFIER"], v["DEPLOYD_APP"], v["DEPLOYD_STREAM"] = fr.app, fr.app, fr.stream
	v["DEPLOYD_WORKER"], v["DEPLOYD_PID"] = strconv.Itoa(fr.slot), strconv.Itoa(fr.pid)
	setOrDelete(v, "DEPLOYD_RELEASE", fr.release)
	setOrDelete(v, "DEPLOYD_APPEND", j.id)
	// journald adds OBJECT_COMM, OBJECT_EXE, OBJECT_SYSTEMD_UNIT... of
	// the worker when the sender is root (the agent's own pid is _PID).
	if fr.pid > 0 && fr.stream != markerStream {
		v["OBJECT_PID"] = strconv.Itoa(fr.pid)
	} else {
		delete(v, "OBJECT_PID")
	}
	return j.conn.Send(msg, prio, v)
}

func setOrDelete(m map[string]string, k, v string) {
	if v == "" {
		delete(m, k)
		return
	}
	m[k] = v
}

// resolve tells how much of the append rec, recorded by an agent that
// died, is in the journal: all of it, or its first entries (one socket's
// datagrams arrive in order), of which the worker's lines are counted.
// When it cannot tell, it answers none: a line may then show twice, but
// none is lost.
func (j *journald) resolve(rec *Append) Found {
	if err := j.settle(); err != nil {
		j.log.Warn("cannot tell which lines the dead agent sent to the journal; sending them again (some may show twice)", "error", err)
		return Found{}
	}
	id := hex.EncodeToString(rec.Sum[:appendIDLen])
	es, err := j.conn.Count("DEPLOYD_APPEND", id)
	if err != nil { // es holds what was read: the first entries, or none
		j.log.Warn("cannot count the dead agent's entries in the journal; sending what it does not show again (some may show twice)", "append", id, "error", err)
	}
	if len(es) > 0 && len(es) >= es[0].N {
		j.log.Info("settled the dead agent's batch: all of it is in the journal", "append", id, "entries", len(es))
		return Found{All: true}
	}
	lines := 0
	for _, e := range es {
		if e.Stream != markerStream {
			lines++
		}
	}
	j.log.Info("settled the dead agent's batch: sending what is not in the journal", "append", id, "entries", len(es), "lines", lines)
	return Found{Lines: lines}
}

// settle waits (once, at most settleTimeout) until an entry sent now is in
// the journal: what an agent sent before it died came into journald's
// socket before it, so it is in the journal too.
func (j *journald) settle() error {
	if j.settled {
		return nil
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	if err := j.conn.Send("deployd: settling the output of workers after an agent restart", journal.PriDebug,
		map[string]string{"SYSLOG_IDENTIFIER": "deployd", "DEPLOYD_BARRIER": id}); err != nil {
		return fmt.Errorf("logs: journald: barrier: %w", err)
	}
	deadline := time.Now().Add(settleTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		es, err := j.conn.Count("DEPLOYD_BARRIER", id)
		if err == nil && len(es) > 0 {
			j.settled = true
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("logs: journald: the barrier entry did not show within %s (dropped by journald's rate limit?): %w",
				settleTimeout, errors.Join(err, errors.New("not found")))
		}
		time.Sleep(wait) // journald writes the entry on its own time: poll
	}
}

// settleTimeout bounds the wait for the barrier entry.
const settleTimeout = 10 * time.Second

// frame is a line as formatJournald writes it.
type frame struct {
	app, stream, release, text string
	slot, pid                  int
}

// appendFrame appends l as a frame: app, slot, pid, stream and release,
// space-separated (none holds a space), then the text, then a newline.
func appendFrame(b []byte, l *Line) []byte {
	b = append(b, l.App...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(l.Slot), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(l.PID), 10)
	b = append(b, ' ')
	b = append(b, l.Stream...)
	b = append(b, ' ')
	b = append(b, l.Release...)
	b = append(b, ' ')
	b = append(b, l.Text...)
	return append(b, '\n')
}

func parseFrame(p []byte) (frame, bool) {
	f := strings.SplitN(string(p), " ", 6)
	if len(f) != 6 {
		return frame{}, false
	}
	slot, err1 := strconv.Atoi(f[1])
	pid, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return frame{}, false
	}
	return frame{app: f[0], slot: slot, pid: pid, stream: f[3], release: f[4], text: f[5]}, true
}

// linePriority is the PRIORITY and MESSAGE of a line: the app's own "<N>"
// prefix (N 0 to 7, as systemd reads it on a service's stdout: "<3>",
// "<03>" or "<003>") removed from the text, or else by stream: stderr 3
// (err), stdout 6 (info), the Sink's marker lines 4 (warning).
func linePriority(stream, text string) (journal.Priority, string) {
	if len(text) >= 3 && text[0] == '<' {
		if end := strings.IndexByte(text[:min(len(text), 5)], '>'); end >= 2 {
			digits := text[1:end]
			if strings.Trim(digits[:len(digits)-1], "0") == "" && digits[len(digits)-1] >= '0' && digits[len(digits)-1] <= '7' {
				return journal.Priority(digits[len(digits)-1] - '0'), text[end+1:]
			}
		}
	}
	switch stream {
	case "err":
		return journal.PriErr, text
	case markerStream:
		return journal.PriWarning, text
	}
	return journal.PriInfo, text
}
