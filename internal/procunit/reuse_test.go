package procunit

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/pidns"
)

// Once a unit's command was reaped, its pid may go to another process: a
// process group that gets it is not the unit's, and neither Signal, Kill
// nor End reaches it, with the cgroup or the sweep. In a PID namespace of
// its own, ns_last_pid makes the next process get the reaped pid.
func TestReapedCommandsPidIsNotSignalled(t *testing.T) {
	if !pidns.Enter(t) {
		return
	}
	for _, sweep := range modes(t) {
		noCgroup = sweep
		var u *Unit
		var cmd *exec.Cmd
		var victim *pidns.Victim
		for try := 1; victim == nil; try++ {
			if try > 3 {
				t.Fatal("another process took the reaped pid first, three times")
			}
			var err error
			cmd, u, err = Start("test", func() *exec.Cmd { return exec.Command("true") })
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			if victim = pidns.NewVictim(t, cmd.Process.Pid); victim == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = u.End(ctx)
				cancel()
			}
		}
		u.Signal(syscall.SIGTERM)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kerr := u.Kill(ctx)
		left, eerr := u.End(ctx)
		cancel()
		t.Logf("%s: command %d reaped, its pid taken by a process group; Kill: %v; End: %v, %v",
			u.Mode(), cmd.Process.Pid, kerr, left, eerr)
		if len(left) > 0 {
			t.Errorf("%s: End found %v in a unit whose command was reaped and left nothing", u.Mode(), left)
		}
		victim.MustSurvive(t, 100*time.Millisecond)
	}
	noCgroup = false
}
