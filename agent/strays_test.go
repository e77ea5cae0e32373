package agent

import (
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers"
)

// startMarked starts `sleep` as a process group leader (or not) with env
// first in its environment; it is killed when the test ends.
func startMarked(t *testing.T, leader bool, env ...string) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: leader}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

func TestStraysAreFoundByTheirMarker(t *testing.T) {
	dir := t.TempDir()
	// A dead agent: a process that has exited (its pid, start time 1).
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s=%s.%d.1", workers.EnvAgentID, installation(dir), gone.Process.Pid)
	stray := startMarked(t, true, dead, "DEPLOYD_APP=web", "DEPLOYD_WORKER=2")
	child := startMarked(t, false, dead, "DEPLOYD_APP=web") // a worker's child: retired with its group
	other := startMarked(t, true, fmt.Sprintf("%s=%s.%d.1", workers.EnvAgentID, installation(t.TempDir()),
		gone.Process.Pid), "DEPLOYD_APP=web") // another installation's
	mine := startMarked(t, true, workers.EnvAgentID+"="+agentMarker(dir), "DEPLOYD_APP=web") // this agent's
	known := startMarked(t, true, dead, "DEPLOYD_APP=web")
	// A setsid daemon a known (adopted) worker left, in that worker's unit:
	// retired as a stray, its unit's end would kill the worker too.
	left := startMarked(t, true, dead, "DEPLOYD_APP=web", procunit.MarkerVar+"=0123456789abcdef")

	found := map[int]survivor{}
	for _, s := range strays(dir, map[int]bool{known: true}, map[string]bool{"0123456789abcdef": true}) {
		found[s.p.PID] = s
	}
	s, ok := found[stray]
	if !ok || s.app != "web" || s.p.Slot != 2 || !s.stray || s.agentPID != gone.Process.Pid || s.p.StartTime == 0 {
		t.Errorf("stray %d: found %v, %+v", stray, ok, s)
	}
	for name, pid := range map[string]int{"a non-leader": child, "another installation's": other,
		"this agent's": mine, "a recorded one": known, "a known worker's daemon": left} {
		if _, ok := found[pid]; ok {
			t.Errorf("%s process %d taken for a stray", name, pid)
		}
	}
}

func TestParseMarker(t *testing.T) {
	for in, want := range map[string]bool{"12.34": true, "12": false, "x.34": false, "0.1": false, "12.-1": false} {
		if _, _, ok := parseMarker(in); ok != want {
			t.Errorf("parseMarker(%q): %v, want %v", in, ok, want)
		}
	}
	vars := parseEnviron([]byte("A=1\x00B=2\x00A=3\x00C"))
	if _, cut := vars["C"]; vars["A"] != "1" || vars["B"] != "2" || cut {
		t.Errorf("parseEnviron: %v", vars)
	}
}

// A stray carries its unit's marker: it is found with its unit, and
// retiring it kills a process that left its group with the marker (a
// setsid daemon of the stray's; here a sleep in a session of its own).
func TestStrayRetiredWithWhatItLeft(t *testing.T) {
	dir := t.TempDir()
	sv := &survivors{stateDir: dir, log: hclog.NewNullLogger()}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s=%s.%d.1", workers.EnvAgentID, installation(dir), gone.Process.Pid)
	unit := procunit.MarkerVar + "=strayunit" + strconv.Itoa(gone.Process.Pid)
	stray := startMarked(t, true, dead, "DEPLOYD_APP=web", unit)
	daemon := exec.Command("sleep", "60")
	daemon.Env = []string{unit}
	daemon.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	exited := make(chan struct{})
	go func() { _ = daemon.Wait(); close(exited) }()
	var ss []survivor
	for _, s := range strays(dir, nil, nil) {
		if s.p.PID == stray {
			ss = append(ss, s)
		}
	}
	if len(ss) != 1 || ss[0].p.Unit == nil || ss[0].p.Unit.ID == "" {
		t.Fatalf("stray %d: found %+v, want it with its unit", stray, ss)
	}
	sv.retire(ss, nil)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stray's daemon %d runs on 10s after the stray was retired", daemon.Process.Pid)
	}
}
