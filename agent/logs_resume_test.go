package agent

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// posOf is the position of offset in the file at path.
func posOf(t *testing.T, path string, off int64) api.LogPos {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return api.LogPos{App: "web", Dev: uint64(st.Dev), Ino: st.Ino, Offset: off}
}

// lineList is a LogOut that keeps the lines sent.
type lineList struct {
	mu    sync.Mutex
	lines []api.LogLine
}

func (l *lineList) Send(line api.LogLine) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	return nil
}

func (l *lineList) Flush() {}

// resumeLines runs resumeFrom and returns the offset and the lines it sent.
func resumeLines(t *testing.T, path string, p api.LogPos) (int64, []api.LogLine) {
	t.Helper()
	var ls lineList
	from := resumeFrom(&ls, logTarget{app: "web", path: path}, p)
	return from, ls.lines
}

func TestResumeFromGoesOnWhereTheFollowStopped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.out.log")
	if err := os.WriteFile(path, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := posOf(t, path, 2) // after "a\n"
	if from, ls := resumeLines(t, path, p); from != 2 || len(ls) != 0 {
		t.Errorf("same file: from %d, lines %v; want 2 and none", from, ls)
	}
	// Rotated meanwhile: the rest of the old file first, then the new one whole.
	rotated := filepath.Join(dir, "web.out-2026-12-02T00-00-00.000.log")
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from, ls := resumeLines(t, path, p)
	if from != 0 || len(ls) != 2 || ls[0].Line != "b" || ls[1].Line != "c" {
		t.Errorf("rotated: from %d, lines %+v; want 0 and b, c", from, ls)
	}
	// The rotated file is gone (compressed): say so, then the new file whole.
	if err := os.Remove(rotated); err != nil {
		t.Fatal(err)
	}
	from, ls = resumeLines(t, path, p)
	if from != 0 || len(ls) != 1 || ls[0].Error == "" {
		t.Errorf("rotated and gone: from %d, lines %+v; want 0 and one error", from, ls)
	}
	// Emptied since (logs --flush): from its start.
	if from, _ := resumeLines(t, path, posOf(t, path, 100)); from != 0 {
		t.Errorf("emptied: from %d, want 0", from)
	}
}

func TestParseLogPos(t *testing.T) {
	p := api.LogPos{App: "web:x", Dev: 1, Ino: 2, Offset: 3}
	got, err := api.ParseLogPos(p.String())
	if err != nil || got != p {
		t.Errorf("ParseLogPos(%q) = %+v, %v", p.String(), got, err)
	}
	for _, bad := range []string{"", "1:2:3", "1:2:-3:web", "x:2:3:web", "1:2:3:"} {
		if _, err := api.ParseLogPos(bad); err == nil {
			t.Errorf("ParseLogPos(%q) accepted", bad)
		}
	}
}
