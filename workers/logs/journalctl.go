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
		"--output-fields=DEPLOYD_APPEND_N,DEPLOYD_PID", field+"="+value)
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
		var e struct{ DEPLOYD_APPEND_N, DEPLOYD_PID string }
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		n, _ := strconv.Atoi(e.DEPLOYD_APPEND_N)
		pid, _ := strconv.Atoi(e.DEPLOYD_PID)
		es = append(es, appendEntry{N: n, PID: pid})
	}
	if len(es) >= countMax {
		cancel() // the rest is not read
	}
	if err := cmd.Wait(); err != nil && len(es) < countMax {
		return es, fmt.Errorf("logs: journalctl %s=%s: %w", field, value, err)
	}
	return es, nil
}
