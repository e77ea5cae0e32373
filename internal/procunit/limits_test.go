package procunit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startLimited starts script under sh in a unit with l, held at a read of
// stdin until the unit's limits apply to it; it returns the unit and the
// open stdin that releases it.
func startLimited(t *testing.T, l Limits, script string) (*Unit, *exec.Cmd, func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("limits need root (or a delegated cgroup)")
	}
	if un := Check(l); len(un) > 0 {
		t.Skipf("limits cannot apply here: %v", un)
	}
	u := New("limits-test")
	if un := u.Limit(l); len(un) > 0 {
		t.Fatalf("Limit: %v", un)
	}
	cmd := u.prepare(exec.Command("sh", "-c", "read x; "+script))
	if fd, ok := u.CgroupFD(); ok {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u.Started(cmd.Process.Pid)
	if err := u.Join(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = u.Kill(ctx)
		_ = cmd.Wait()
		if _, err := u.End(ctx); err != nil {
			t.Errorf("End: %v", err)
		}
		for c, dir := range u.Record().V1 {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("%s cgroup %s left behind", c, dir)
			}
		}
	})
	return u, cmd, func() { in.Write([]byte("go\n")); in.Close() }
}

// TestLimitPidsMax: a fork bomb in a unit with pids_max stops at the
// limit, and the kernel's count of refused forks says so.
func TestLimitPidsMax(t *testing.T) {
	u, cmd, release := startLimited(t, Limits{PidsMax: 8},
		`i=0; while [ $i -lt 20 ]; do sleep 30 & i=$((i+1)); done; echo done`)
	_ = cmd
	release()
	deadline := time.Now().Add(10 * time.Second)
	for u.Stats().ForksRefused == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no fork refused; %d processes in the unit", len(u.Procs()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(u.Procs()); n > 8 {
		t.Fatalf("%d processes in a unit with pids_max 8", n)
	}
}

// TestLimitMemoryMax: a unit over memory_max is OOM-killed by the kernel,
// and the unit's stats count the kill.
func TestLimitMemoryMax(t *testing.T) {
	u, cmd, release := startLimited(t, Limits{MemoryMax: 16 << 20},
		// At most 64 MiB (a few copies of it): bounded should the limit fail.
		`x=a; i=0; while [ $i -lt 26 ]; do x="$x$x"; i=$((i+1)); done`)
	release()
	err := cmd.Wait()
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the shell ended with %v, not killed", err)
	}
	if st := u.Stats(); st.OOMKills == 0 {
		t.Fatalf("no OOM kill counted: %+v", st)
	}
}

// TestLimitCPUFiles: cpu_weight and cpu_max land in the cgroup files with
// systemd's mapping.
func TestLimitCPUFiles(t *testing.T) {
	u, _, release := startLimited(t, Limits{CPUWeight: 50, CPUMax: 150}, `sleep 30`)
	defer release()
	dir, v2 := u.Record().V1["cpu"], false
	if dir == "" {
		dir, v2 = u.Record().Cgroup, true
	}
	want := map[string]string{"cpu.shares": "512", "cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"}
	if v2 {
		want = map[string]string{"cpu.weight": "50", "cpu.max": "150000 100000"}
	}
	for f, w := range want {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || strings.TrimSpace(string(b)) != w {
			t.Errorf("%s = %q (%v), want %q", f, b, err, w)
		}
	}
}

func TestWeightToShares(t *testing.T) {
	for w, s := range map[int]uint64{1: 10, 100: 1024, 1000: 10240, 10000: 102400, 50: 512} {
		if got := WeightToShares(w); got != s {
			t.Errorf("WeightToShares(%d) = %d, want %d", w, got, s)
		}
	}
}
