package logs

import (
	"crypto/sha256"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/hashicorp/go-hclog"
)

func TestLinePriority(t *testing.T) {
	for _, c := range []struct {
		stream, text, msg string
		prio              journal.Priority
	}{
		{"out", "hello", "hello", journal.PriInfo},
		{"err", "boom", "boom", journal.PriErr},
		{markerStream, "deployd: dropped 3 lines", "deployd: dropped 3 lines", journal.PriWarning},
		{"out", "<3>failed", "failed", journal.PriErr},
		{"err", "<7>debug", "debug", journal.PriDebug},
		{"out", "<0>", "", journal.PriEmerg},
		{"out", "<03>x", "x", journal.PriErr},
		{"out", "<003>x", "x", journal.PriErr},
		{"out", "<8>x", "<8>x", journal.PriInfo},       // not a priority: kept
		{"out", "<13>x", "<13>x", journal.PriInfo},     // a facility: systemd keeps it too
		{"out", "<0003>x", "<0003>x", journal.PriInfo}, // too long
		{"out", "<a>x", "<a>x", journal.PriInfo},
		{"out", "<>x", "<>x", journal.PriInfo},
		{"out", "<3", "<3", journal.PriInfo},
		{"out", " <3>x", " <3>x", journal.PriInfo},
	} {
		prio, msg := linePriority(c.stream, c.text)
		if prio != c.prio || msg != c.msg {
			t.Errorf("linePriority(%q, %q) = %d, %q; want %d, %q", c.stream, c.text, prio, msg, c.prio, c.msg)
		}
	}
}

func TestFormatsPM2AndOTel(t *testing.T) {
	l := Line{Time: time.Date(2026, 11, 30, 3, 22, 48, 123e6, time.UTC), App: "web", Slot: 2, PID: 4242,
		Stream: "err", Text: `say "hi"`, Release: "v42"}
	for _, c := range []struct{ format, want string }{
		{FormatPM2JSON, `{"message":"say \"hi\"","timestamp":"2026-11-30T03:22:48.123Z","type":"err","process_id":2,"app_name":"web"}` + "\n"},
		{FormatJSON, `{"time":"2026-11-30T03:22:48.123Z","app":"web","slot":2,"pid":4242,"stream":"err","msg":"say \"hi\"",` +
			`"service.name":"web","service.instance.id":"web/2","service.version":"v42","process.pid":4242}` + "\n"},
	} {
		if got := string(appendLine(nil, c.format, &l)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.format, got, c.want)
		}
	}
	l.Release = ""
	if got, want := string(appendLine(nil, FormatJSON, &l)), `"service.instance.id":"web/2","process.pid":4242}`+"\n"; got[len(got)-len(want):] != want {
		t.Errorf("json without a release: %s", got)
	}
}

// fakeJournal is journald in memory; fail makes Send fail after that many
// more entries (an agent that dies in the middle of an append).
type fakeJournal struct {
	entries []map[string]string
	fail    int
}

func (f *fakeJournal) Send(msg string, prio journal.Priority, vars map[string]string) error {
	if f.fail == 0 {
		return errors.New("agent killed")
	}
	f.fail--
	e := map[string]string{"MESSAGE": msg, "PRIORITY": strconv.Itoa(int(prio))}
	for k, v := range vars {
		e[k] = v
	}
	f.entries = append(f.entries, e)
	return nil
}

func (f *fakeJournal) Count(field, value string) ([]appendEntry, error) {
	var es []appendEntry
	for _, e := range f.entries {
		if e[field] == value {
			n, _ := strconv.Atoi(e["DEPLOYD_APPEND_N"])
			es = append(es, appendEntry{N: n, Stream: e["DEPLOYD_STREAM"]})
		}
	}
	return es, nil
}

// TestJournaldResolve: of an append the dead agent sent whole, in part or
// not at all, the next agent finds how many of its lines are in the
// journal (after the barrier), and the entries that are carry their
// fields.
func TestJournaldResolve(t *testing.T) {
	for _, sent := range []int{0, 1, 3, 5} {
		t.Run(strconv.Itoa(sent), func(t *testing.T) {
			fj := &fakeJournal{fail: sent}
			var data []byte
			for i := range 5 {
				l := Line{Time: time.Now(), App: "web", Slot: 1, PID: 77, Stream: "out", Text: "line " + strconv.Itoa(i), Release: "r1"}
				data = appendLine(data, formatJournald, &l)
			}
			dead := &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}
			pos, _ := dead.position(len(data))
			rec := &Append{Dev: pos.Dev, Off: pos.Size, Len: int64(len(data)), Sum: sha256.Sum256(data)}
			_, _ = dead.writeWhole(data) // dies after sent entries

			fj.fail = 1 << 30
			next := &journald{conn: fj, vars: map[string]string{}, log: hclog.NewNullLogger()}
			want := Found{Lines: sent}
			if sent == 5 {
				want = Found{All: true}
			}
			if got := next.resolve(rec); got != want {
				t.Fatalf("resolve = %+v with %d of 5 entries sent, want %+v", got, sent, want)
			}
			for _, e := range fj.entries {
				if e["DEPLOYD_BARRIER"] != "" {
					continue
				}
				if e["SYSLOG_IDENTIFIER"] != "web" || e["DEPLOYD_WORKER"] != "1" || e["DEPLOYD_PID"] != "77" ||
					e["OBJECT_PID"] != "77" || e["DEPLOYD_RELEASE"] != "r1" || e["PRIORITY"] != "6" || e["DEPLOYD_APPEND_N"] != "5" {
					t.Errorf("entry fields: %v", e)
				}
			}
		})
	}
}

func TestJournalLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"__REALTIME_TIMESTAMP":"1796008968123456","MESSAGE":"hello","DEPLOYD_WORKER":"2","DEPLOYD_PID":"4242","DEPLOYD_STREAM":"out"}`,
			"2026-11-30T03:22:48.123Z [web 2 4242] hello\n"},
		{`{"__REALTIME_TIMESTAMP":"1796008968123456","MESSAGE":[104,255],"DEPLOYD_WORKER":"0","DEPLOYD_PID":"9","DEPLOYD_STREAM":"err"}`,
			"2026-11-30T03:22:48.123Z [web 0 9] h\xff\n"},
	} {
		l, ok := journalLine([]byte(c.in), "web")
		if got := string(appendLine(nil, FormatText, &l)); !ok || got != c.want {
			t.Errorf("journalLine(%s) = %q, %v; want %q", c.in, got, ok, c.want)
		}
	}
	if _, ok := journalLine([]byte("not json"), "web"); ok {
		t.Error("journalLine took a line that is not JSON")
	}
}
