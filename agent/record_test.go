package agent

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// The record book writes what runs, what is about to start and what got
// ready, to this agent's record; a start it cannot record is refused with
// the fix; remove takes the record away.
func TestRecordBookWritesTheRecord(t *testing.T) {
	dir := t.TempDir()
	b := newRecordBook(dir, hclog.NewNullLogger())
	self, _ := handoff.StartTime(os.Getpid())
	apps := map[string][]workers.Process{"web": {{Slot: 1, PID: os.Getpid(), StartTime: self}}}
	if err := b.write(apps); err != nil {
		t.Fatal(err)
	}
	if !b.names(apps) {
		t.Error("after write, the book does not name what it wrote")
	}
	if err := b.beforeStart("web")(2); err != nil {
		t.Fatal(err)
	}
	if b.names(apps) {
		t.Error("a pending start is not in the record the recorder compares")
	}
	b.markReady(os.Getpid())
	rec := readRecord(t, b.path())
	if rec.AgentPID != os.Getpid() || rec.Marker != b.marker || len(rec.Apps["web"]) != 1 ||
		len(rec.Starting) != 1 || rec.Starting[0].Slot != 2 || rec.Ready[os.Getpid()].Start != self {
		t.Errorf("record: %+v", rec)
	}
	b.remove()
	if _, err := os.Stat(b.path()); !os.IsNotExist(err) {
		t.Errorf("record left after remove: %v", err)
	}

	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.WriteFile(ro, nil, 0o600); err != nil { // a file where state_dir/agents goes
		t.Fatal(err)
	}
	err := newRecordBook(ro, hclog.NewNullLogger()).beforeStart("web")(1)
	if err == nil || !strings.Contains(err.Error(), "state_dir "+ro) {
		t.Errorf("a start that cannot be recorded: %v, want a refusal naming state_dir", err)
	}
}

// survivors finds the workers a dead agent's record names, with that
// record, and leaves a live agent's record and this agent's own workers.
func TestSurvivorsListsWhatDeadAgentsLeft(t *testing.T) {
	dir := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	worker := startMarked(t, true)
	start, _ := handoff.StartTime(worker)
	mineToo := startMarked(t, true)
	mineStart, _ := handoff.StartTime(mineToo)
	dead := agentRecord{AgentPID: gone.Process.Pid, AgentStart: 1, Apps: map[string][]workers.Process{
		"web": {{Slot: 1, PID: worker, StartTime: start}, {Slot: 2, PID: mineToo, StartTime: mineStart}}}}
	initStart, _ := handoff.StartTime(1)
	live := agentRecord{AgentPID: 1, AgentStart: initStart, Apps: map[string][]workers.Process{
		"api": {{Slot: 1, PID: worker, StartTime: start}}}}
	writeRecordFile(t, dir, gone.Process.Pid, dead)
	writeRecordFile(t, dir, 1, live)
	s := &survivors{log: hclog.NewNullLogger(), stateDir: dir, mine: func() map[string][]workers.Process {
		return map[string][]workers.Process{"web": {{Slot: 2, PID: mineToo}}}
	}}
	found := s.collect()
	if len(found) != 1 || found[0].p.PID != worker || found[0].app != "web" || found[0].agentPID != gone.Process.Pid {
		t.Errorf("found %+v, want only worker %d of app web", found, worker)
	}
	want := filepath.Join(recordsDir(dir), strconv.Itoa(gone.Process.Pid)+".json")
	if len(s.records) != 1 || s.records[0] != want {
		t.Errorf("records %v, want [%s]", s.records, want)
	}
}

func readRecord(t *testing.T, path string) agentRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec agentRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func writeRecordFile(t *testing.T, stateDir string, pid int, rec agentRecord) {
	t.Helper()
	b, err := json.Marshal(rec)
	if err == nil {
		err = os.MkdirAll(recordsDir(stateDir), 0o700)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(recordsDir(stateDir), strconv.Itoa(pid)+".json"), b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
}
