package logs

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

// systemJournal is the journaldConn of the host's journald: it sends with
// go-systemd's journal package and reads with journalctl (no cgo: the
// library that reads journal files, sd-journal, is C).
type systemJournal struct{}

func (systemJournal) Send(msg string, prio journal.Priority, vars map[string]string) error {
	return journal.Send(msg, prio, vars)
}

// countMax bounds the entries Count reads: more than a batch of the
// writer has lines.
const countMax = batchBytes + 1

// queryTimeout bounds one journalctl run.
const queryTimeout = 10 * time.Second

// Count runs journalctl for the entries whose field is value.
func (systemJournal) Count(field, value string) ([]appendEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "journalctl", "--no-pager", "--quiet", "--output=json",
		"--output-fields=DEPLOYD_APPEND_N,DEPLOYD_STREAM", field+"="+value)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("logs: journalctl: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("logs: journalctl: %w", err)
	}
	var es []appendEntry
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && len(es) < countMax {
		var e struct{ DEPLOYD_APPEND_N, DEPLOYD_STREAM string }
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		n, _ := strconv.Atoi(e.DEPLOYD_APPEND_N)
		es = append(es, appendEntry{N: n, Stream: e.DEPLOYD_STREAM})
	}
	if len(es) >= countMax {
		cancel() // the rest is not read
	}
	if err := cmd.Wait(); err != nil && len(es) < countMax {
		return es, fmt.Errorf("logs: journalctl %s=%s: %w", field, value, err)
	}
	return es, nil
}

// maxEntry bounds one entry of journalctl's output that JournalLines
// reads: a line of DefaultMaxLine bytes, escaped as JSON, and its fields.
const maxEntry = 8 * DefaultMaxLine

// JournalLines sends the last n lines of app's stream ("out" or "err")
// that are in the systemd journal (target = "journal"), formatted as the
// text format, and with follow every later one until ctx is done (one
// journalctl run, so no line falls between the two). It reads one entry
// at a time and stops journalctl when send fails.
func JournalLines(ctx context.Context, app, stream string, n int, follow bool, send func(line string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	args := []string{"--no-pager", "--quiet", "--output=json", "--lines=" + strconv.Itoa(n),
		"--output-fields=MESSAGE,DEPLOYD_WORKER,DEPLOYD_PID,DEPLOYD_RELEASE,DEPLOYD_STREAM",
		"DEPLOYD_APP=" + app, "DEPLOYD_STREAM=" + stream, "+", "DEPLOYD_APP=" + app, "DEPLOYD_STREAM=" + markerStream}
	if follow {
		args = append(args, "--follow")
	}
	cmd := exec.CommandContext(ctx, "journalctl", args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("logs: journalctl: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("logs: journalctl: %w", err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, maxEntry)
	var b []byte
	var serr error
	for serr == nil && sc.Scan() {
		l, ok := journalLine(sc.Bytes(), app)
		if !ok {
			continue
		}
		b = appendLine(b[:0], FormatText, &l)
		serr = send(string(b[:len(b)-1]))
	}
	cancel()
	werr := cmd.Wait()
	switch {
	case serr != nil:
		return serr
	case sc.Err() != nil:
		return fmt.Errorf("logs: journalctl: %w", sc.Err())
	case werr != nil && ctx.Err() == nil:
		return fmt.Errorf("logs: journalctl: %w", werr)
	}
	return nil
}

// journalLine is the Line of an entry journalctl printed as JSON.
func journalLine(p []byte, app string) (Line, bool) {
	var e struct {
		Message any    `json:"MESSAGE"` // a string, or an array of bytes when not UTF-8
		Time    string `json:"__REALTIME_TIMESTAMP"`
		Worker  string `json:"DEPLOYD_WORKER"`
		PID     string `json:"DEPLOYD_PID"`
		Stream  string `json:"DEPLOYD_STREAM"`
		Release string `json:"DEPLOYD_RELEASE"`
	}
	if json.Unmarshal(p, &e) != nil {
		return Line{}, false
	}
	l := Line{App: app, Stream: e.Stream, Release: e.Release}
	switch m := e.Message.(type) {
	case string:
		l.Text = m
	case []any:
		b := make([]byte, 0, len(m))
		for _, c := range m {
			if f, ok := c.(float64); ok {
				b = append(b, byte(f))
			}
		}
		l.Text = string(b)
	}
	us, _ := strconv.ParseInt(e.Time, 10, 64)
	l.Time = time.UnixMicro(us)
	l.Slot, _ = strconv.Atoi(e.Worker)
	l.PID, _ = strconv.Atoi(e.PID)
	return l, true
}
