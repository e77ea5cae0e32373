package logs

import (
	"bytes"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// The agent's own log into the journal: each line an entry with its
// priority, the text format's message, and each key as a DEPLOYD_ field;
// the fields deployd reads back are never taken from a key; a line
// journald does not take goes to stderr.
func TestAgentLogIntoTheJournal(t *testing.T) {
	fj := &fakeJournal{fail: 2}
	var stderr bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Name: "deployd", JSONFormat: true, Output: &journalLog{conn: fj, fallback: &stderr}})
	log.Named("logs").Info("settled the dead agent's batch", "app", "web", "entries", 3, "stream", "out")
	log.Warn("cannot settle", "error-text", "gone")
	log.Error("journald is gone")
	if len(fj.entries) != 2 {
		t.Fatalf("%d entries, want 2: %v", len(fj.entries), fj.entries)
	}
	for k, want := range map[string]string{
		"MESSAGE":           "deployd.logs: settled the dead agent's batch: app=web entries=3 stream=out",
		"PRIORITY":          "6",
		"SYSLOG_IDENTIFIER": "deployd",
		"DEPLOYD_APP":       "web",
		"DEPLOYD_ENTRIES":   "3",
		"DEPLOYD_STREAM":    "",
	} {
		if got := fj.entries[0][k]; got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if e := fj.entries[1]; e["PRIORITY"] != "4" || e["DEPLOYD_ERROR_TEXT"] != "gone" {
		t.Errorf("warn entry: %v", e)
	}
	if !bytes.Contains(stderr.Bytes(), []byte(`"@message":"journald is gone"`)) {
		t.Errorf("the line journald did not take is not on stderr: %q", stderr.String())
	}
}
