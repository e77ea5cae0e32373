package logs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary a capturing agent (captureHelper).
const helperEnv = "DEPLOYD_LOGS_TEST_HELPER"

// captureHelper is an agent's capture of one worker stream: the pipe at fd
// 3, the journal at fd 4, the log file at $LOG (rotated at 16 KiB, so that
// appends cross rotations), until EOF. With $JOURNALD (target = "both")
// it sends each line to a journald too, kept in that file (fileJournal).
func captureHelper() int {
	_ = unix.SetNonblock(3, true) // exec made it blocking; the poller needs it not
	r := os.NewFile(3, "pipe")
	j, err := OpenJournal(os.NewFile(4, "journal"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	o := Options{Path: os.Getenv("LOG"), Format: FormatText, MaxSize: 16 << 10}
	if path := os.Getenv("JOURNALD"); path != "" {
		o.Target = TargetBoth
		journalEnabled = func() bool { return true }
		newJournaldConn = func() journaldConn { return fileJournal(path) }
	}
	s, err := OpenSink(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	line := func(text string) Line { return Line{Time: time.Now(), App: "web", PID: 42, Stream: "out", Text: text} }
	err = CaptureJournaled(r, j, nil, s, 0, line, func(string) {})
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestJournalExactlyOnceAcrossSIGKILLs SIGKILLs the capturing agent (a
// helper process) up to 100 times (at least 30) at random moments while a writer fills the
// pipe with numbered lines as fast as it can; each time the next helper
// takes the same pipe and journal. Every line is in the log files exactly
// once and in order: none lost with an agent, none written twice.
func TestJournalExactlyOnceAcrossSIGKILLs(t *testing.T) {
	exactlyOnceAcrossSIGKILLs(t, testPath(t), "", 1_000_000)
}

// TestBothExactlyOnceAcrossSIGKILLs is TestJournalExactlyOnceAcrossSIGKILLs
// with target = "both": every line once and in order in the files, and
// once and in order in the journald (a file, as the real one keeps what it
// was sent when the sender dies). A kill often falls between the files'
// write of a batch and the end of its sending to the journal (the slower):
// the next agent settles each place's batch, and sends the journal the
// lines the files have and it has not.
func TestBothExactlyOnceAcrossSIGKILLs(t *testing.T) {
	path := testPath(t)
	jd := filepath.Join(t.TempDir(), "journald")
	exactlyOnceAcrossSIGKILLs(t, path, jd, 200_000)
	es, err := fileJournal(jd).entries()
	if err != nil {
		t.Fatal(err)
	}
	next, settled := 1, 0
	for _, e := range es {
		if e["DEPLOYD_BARRIER"] != "" {
			settled++
			continue
		}
		if e["MESSAGE"] != fmt.Sprintf("line %d", next) || e["DEPLOYD_APP"] != "web" || e["DEPLOYD_PID"] != "42" {
			t.Fatalf("journal: after line %d: %v (lost or repeated lines)", next-1, e)
		}
		next++
	}
	if next != 200_000+1 {
		t.Fatalf("journal: %d lines, want %d", next-1, 200_000)
	}
	t.Logf("journal: every line once, in order; %d agents settled a dead one's batches", settled)
}

// exactlyOnceAcrossSIGKILLs is the test of the log at path (and with
// journald, of target = "both" with that fileJournal) through SIGKILLs,
// total lines.
func exactlyOnceAcrossSIGKILLs(t *testing.T, path, journald string, total int) {
	if err := os.MkdirAll(path[:strings.LastIndexByte(path, '/')], 0o755); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	j, err := NewJournal("out")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	const kills, minKills = 100, 30
	wrote := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(pw, 1000) // lines cut across writes, too
		for i := 1; i <= total; i++ {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				wrote <- err
				return
			}
		}
		err := w.Flush()
		pw.Close()
		wrote <- err
	}()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	killed := 0
	for writing := true; writing && killed < kills; {
		before := logBytes(t, path)
		cmd := helper(t, path, journald, pr, j)
		// Kill it while it writes: once the log grew, at a random moment
		// within the next 2 ms (random by design, not a wait).
		for deadline := time.Now().Add(10 * time.Second); logBytes(t, path) == before; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("kill %d: the helper wrote nothing in 10 s", killed+1)
			}
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		if err := cmd.Wait(); err == nil {
			t.Fatalf("kill %d: the helper ended before its SIGKILL", killed+1)
		}
		killed++
		select {
		case err := <-wrote: // the writer is done: the last helper reads the rest
			wrote <- err
			writing = false
		default:
		}
	}
	if killed < minKills {
		t.Fatalf("only %d kills before the writer was done; want %d (a faster machine needs more lines)", killed, minKills)
	}
	t.Logf("%d SIGKILLs of the capturing agent", killed)
	cmd := helper(t, path, journald, pr, j)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	select {
	case err := <-waitDone:
		if err != nil {
			t.Fatalf("last helper: %v", err)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the last helper did not reach EOF in 60 s")
	}
	next := 1
	for _, l := range readLines(t, logFiles(t, path)...) {
		_, text, ok := strings.Cut(l, "] ")
		n, err := strconv.Atoi(strings.TrimPrefix(text, "line "))
		if !ok || err != nil || n != next {
			t.Fatalf("after line %d: %q (lost or repeated lines, or a torn one)", next-1, l)
		}
		next++
	}
	if next != total+1 {
		t.Fatalf("%d lines, want %d", next-1, total)
	}
}

// logBytes is the size of the log's files together.
func logBytes(t *testing.T, path string) int64 {
	var n int64
	for _, f := range logFiles(t, path) {
		if st, err := os.Stat(f); err == nil {
			n += st.Size()
		}
	}
	return n
}

// helper starts captureHelper on the pipe and journal.
func helper(t *testing.T, path, journald string, pr *os.File, j *Journal) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=capture", "LOG="+path, "JOURNALD="+journald)
	cmd.ExtraFiles = []*os.File{pr, j.File()}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestOpenJournalLeavesOtherFilesAlone: the fd a worker kept may now be a
// file of the app's; OpenJournal refuses it without writing to it.
func TestOpenJournalLeavesOtherFilesAlone(t *testing.T) {
	path := t.TempDir() + "/data"
	if err := os.WriteFile(path, []byte("the app's data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if j, err := OpenJournal(f); err == nil || j != nil {
		t.Fatalf("OpenJournal of a plain file: %v, %v; want an error", j, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "the app's data\n" {
		t.Fatalf("the file now holds %q", b)
	}
}

// fileJournal is a journald that keeps its entries in a file, a JSON
// object a line, each appended in one write: what a helper sent before
// its SIGKILL stays, as in the real journal.
type fileJournal string

func (f fileJournal) Send(msg string, prio journal.Priority, vars map[string]string) error {
	e := map[string]string{"MESSAGE": msg, "PRIORITY": strconv.Itoa(int(prio))}
	for k, v := range vars {
		e[k] = v
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	fd, err := os.OpenFile(string(f), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer fd.Close()
	_, err = fd.Write(append(b, '\n'))
	return err
}

func (f fileJournal) Count(field, value string) ([]appendEntry, error) {
	b, err := os.ReadFile(string(f))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	key, _ := json.Marshal(map[string]string{field: value})
	key = key[1 : len(key)-1] // "field":"value"
	var es []appendEntry
	for l := range bytes.Lines(b) {
		if !bytes.Contains(l, key) {
			continue
		}
		var e map[string]string
		if json.Unmarshal(l, &e) != nil || e[field] != value {
			continue
		}
		n, _ := strconv.Atoi(e["DEPLOYD_APPEND_N"])
		es = append(es, appendEntry{N: n, Stream: e["DEPLOYD_STREAM"]})
	}
	return es, nil
}

// entries are the entries sent, in order.
func (f fileJournal) entries() ([]map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, err
	}
	var es []map[string]string
	for l := range bytes.Lines(b) {
		var e map[string]string
		if err := json.Unmarshal(l, &e); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		es = append(es, e)
	}
	return es, nil
}
