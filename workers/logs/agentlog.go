package logs

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/journal"
)

// JournalLogOutput is where the agent's own log goes when it runs under
// systemd with stderr connected to the journal (JOURNAL_STREAM names it):
// every line of the logger (hclog, in its JSON format) becomes one journal
// entry through the native protocol, structured as the apps' entries are:
// SYSLOG_IDENTIFIER=deployd, PRIORITY from the level, MESSAGE as the text
// format shows it ("deployd.logs: settled ...: app=web"), and each key as
// a field DEPLOYD_<KEY> (app=web: DEPLOYD_APP=web, so `journalctl
// DEPLOYD_APP=web` shows the app's lines and what the agent said about
// it). ok is false, and stderr is to be used as before, when stderr is not
// the journal or journald's socket is not there. A line journald does not
// take goes to stderr.
func JournalLogOutput(stderr io.Writer) (w io.Writer, ok bool) {
	if is, err := journal.StderrIsJournalStream(); err != nil || !is || !journal.Enabled() {
		return nil, false
	}
	return &journalLog{conn: systemJournal{}, fallback: stderr}, true
}

// journalLog is the agent logger's output into the journal; safe for
// concurrent use (hclog writes a line per call, under its own lock).
type journalLog struct {
	mu       sync.Mutex
	conn     journaldConn
	fallback io.Writer
}

func (l *journalLog) Write(p []byte) (int, error) {
	msg, prio, vars, ok := agentEntry(p)
	if !ok {
		return l.fallback.Write(p)
	}
	l.mu.Lock()
	err := l.conn.Send(msg, prio, vars)
	l.mu.Unlock()
	if err != nil {
		return l.fallback.Write(p)
	}
	return len(p), nil
}

// agentEntry is the journal entry of one line of hclog's JSON format.
func agentEntry(p []byte) (msg string, prio journal.Priority, vars map[string]string, ok bool) {
	var e map[string]any
	if json.Unmarshal(p, &e) != nil {
		return "", 0, nil, false
	}
	level, _ := e["@level"].(string)
	module, _ := e["@module"].(string)
	text, _ := e["@message"].(string)
	vars = map[string]string{"SYSLOG_IDENTIFIER": "deployd"}
	var b strings.Builder
	if module != "" {
		b.WriteString(module + ": ")
	}
	b.WriteString(text)
	keys := make([]string, 0, len(e))
	for k := range e {
		if !strings.HasPrefix(k, "@") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) > 0 {
		b.WriteString(":")
	}
	for _, k := range keys {
		v := fmt.Sprint(e[k])
		if s, isString := e[k].(string); isString {
			v = s
		}
		fmt.Fprintf(&b, " %s=%s", k, v)
		if f := "DEPLOYD_" + fieldName(k); !readerFields[f] {
			vars[f] = v
		}
	}
	return b.String(), levelPriority(level), vars, true
}

// readerFields are the fields of the apps' entries that deployd reads back
// (JournalLines, the settling of a batch): never taken from a key of the
// agent's log.
var readerFields = map[string]bool{"DEPLOYD_STREAM": true, "DEPLOYD_APPEND": true, "DEPLOYD_APPEND_N": true, "DEPLOYD_BARRIER": true}

// fieldName is key as a journal field name: upper case, what is not a
// letter or digit an underscore.
func fieldName(key string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, key)
}

// levelPriority is the syslog priority of an hclog level.
func levelPriority(level string) journal.Priority {
	switch level {
	case "error":
		return journal.PriErr
	case "warn":
		return journal.PriWarning
	case "info":
		return journal.PriInfo
	}
	return journal.PriDebug
}
