package workers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/procunit"
)

func init() {
	// daemonizing is serve-ready after it started a sleeper in a session
	// of its own (setsid) that keeps stdout, and wrote its pid to
	// $DAEMON_PID_FILE.
	helpers["daemonizing"] = func() int {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=sleeper")
		cmd.Stdout = os.Stdout
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return 6
		}
		pid := strconv.Itoa(cmd.Process.Pid)
		if err := os.WriteFile(os.Getenv("DAEMON_PID_FILE"), []byte(pid), 0o644); err != nil {
			return 6
		}
		return serveReady()
	}
	helpers["sleeper"] = func() int {
		time.Sleep(helperLifetime)
		return 0
	}
}

// A worker's setsid child is killed when the worker stops, with the
// cgroup and with the sweep, and the worker's record names its unit.
func TestStopKillsWhatTheWorkerLeft(t *testing.T) {
	for _, mode := range []procunit.Mode{procunit.ModeCgroup, procunit.ModeSweep} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == procunit.ModeSweep {
				t.Setenv(procunit.EnvNoCgroup, "1")
			}
			pidFile := filepath.Join(t.TempDir(), "daemon.pid")
			spec := testSpec(t, newListener(t), "daemonizing", 1)
			spec.Env = append(spec.Env, "DAEMON_PID_FILE="+pidFile)
			s := newSupervisor(t, spec)
			mustStart(t, s)
			b, err := os.ReadFile(pidFile)
			daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || daemon <= 0 {
				t.Fatalf("the worker wrote no daemon pid: %q, %v", b, err)
			}
			t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGKILL) })
			ps := s.Processes()
			if len(ps) != 1 || ps[0].Unit == nil || ps[0].Unit.ID == "" || ps[0].Unit.PGID != ps[0].PID {
				t.Fatalf("processes %+v: want one with its unit", ps)
			}
			w := currentWorkers(s)[0]
			if got := w.unit.Mode(); got != mode && !(mode == procunit.ModeCgroup && got == procunit.ModeSweep &&
				os.Geteuid() != 0) {
				t.Errorf("unit tracked by %s, want %s", got, mode)
			}
			if processGone(daemon) {
				t.Fatalf("daemon %d is gone before the stop", daemon)
			}
			s.Stop()
			if !processGone(daemon) {
				t.Errorf("daemon %d (setsid child of worker %d) runs on after the stop", daemon, w.PID)
			}
			if c := ps[0].Unit.Cgroup; c != "" {
				if _, err := os.Stat(c); !os.IsNotExist(err) {
					t.Errorf("cgroup %s not removed: %v", c, err)
				}
			}
		})
	}
}
