package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestFullStateDirLeavesNoOrphan: with state_dir full, `scale` cannot
// record the workers it would start, so it starts none (and says why);
// then the agent is SIGKILLed. A worker of it that no record names (as
// one started just before the kill would be: a stray, made here by hand
// with the agent's marker) is found by the next agent and retired with
// the recorded ones: no orphan is left.
func TestFullStateDirLeavesNoOrphan(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 1, ""))
	state := filepath.Join(a.Dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", state, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		skipOrFail(t, "cannot mount a tmpfs for state_dir (tests run as root): "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(state, syscall.MNT_DETACH) }) // after the agent stops
	a.Start()
	st := a.WaitFor("web ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	seen := allWorkerPIDs(st)
	var marker string
	for pid := range seen {
		marker = environ(t, pid)["DEPLOYD_AGENT_ID"]
	}

	// state_dir full.
	filler := filepath.Join(state, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	r := a.CLIWithin(time.Minute, "scale", "web", "3")
	t.Logf("scale web 3 with state_dir full: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	if r.Code == 0 {
		t.Errorf("scale with state_dir full succeeded; it cannot have recorded its workers")
	} else if !strings.Contains(r.Stderr, "record") {
		t.Errorf("scale refused without saying it could not record the workers: %s", r.Stderr)
	}
	for pid := range allWorkerPIDs(a.Status()) {
		seen[pid] = true
	}
	seen = addTestWorkers(t, a.Dir, seen)

	// A worker of this agent that no record names, as if started just
	// before the kill: the agent's marker first in its environment.
	if marker == "" {
		t.Errorf("worker environment has no DEPLOYD_AGENT_ID")
	} else {
		stray := exec.Command("sleep", "300")
		stray.Env = []string{"DEPLOYD_AGENT_ID=" + marker, "DEPLOYD_APP=web", "DEPLOYD_WORKER=7"}
		stray.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := stray.Start(); err != nil {
			t.Fatal(err)
		}
		go stray.Wait()
		t.Cleanup(func() { _ = stray.Process.Kill() })
		seen[stray.Process.Pid] = true
	}

	if err := syscall.Kill(a.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.AwaitExit(t)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	a.Start()
	st = a.WaitFor("web ready under the next agent", 30*time.Second, func(st *api.Status) bool {
		return appOf(st, "web").State == "running" && len(appOf(st, "web").Workers) > 0 &&
			appOf(st, "web").Workers[0].State == "ready"
	})
	fresh := allWorkerPIDs(st)
	old := map[int]bool{}
	for pid := range seen {
		if !fresh[pid] {
			old[pid] = true
		}
	}
	waitAllGone(t, old, 20*time.Second)
	if orphans := addTestWorkers(t, a.Dir, nil); len(orphans) > 0 {
		for pid := range fresh {
			delete(orphans, pid)
		}
		if len(orphans) > 0 {
			t.Errorf("workers of this test's agents that no agent supervises: %v", keys(orphans))
		}
	}
	t.Logf("previous agent's %d processes (%v) gone; next agent's workers %v", len(old), keys(old), keys(fresh))
	if strings.Contains(a.Log(), "retired a stray worker") {
		t.Logf("the next agent said: retired a stray worker")
	} else {
		t.Errorf("the next agent did not say it retired the stray worker\n%s", a.Log())
	}
}

// addTestWorkers adds to m (nil: a new map) every live process whose
// NOTIFY_SOCKET lies under dir: the workers of this test's agents.
func addTestWorkers(t *testing.T, dir string, m map[int]bool) map[int]bool {
	t.Helper()
	if m == nil {
		m = map[int]bool{}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !Alive(pid) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(b), "\x00") {
			if v, ok := strings.CutPrefix(kv, "NOTIFY_SOCKET="); ok && strings.HasPrefix(v, dir) {
				m[pid] = true
			}
		}
	}
	return m
}
