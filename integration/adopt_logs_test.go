package integration

import (
	"bytes"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestLogsFollowAcrossAnUpgrade: a `deployd logs -f` that runs while the
// agent upgrades three times goes on with each new agent from where the old
// one stopped: every numbered line of both adopted workers is printed once,
// none missing. When the agent shuts down the follow ends, saying why, with
// exit 1.
func TestLogsFollowAcrossAnUpgrade(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, abruptApp(port, 2, ""))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := slotPIDs(st, "web")

	cmd := exec.Command(bins.Deployd, "logs", "web", "-f", "-n", "0")
	cmd.Dir = a.Dir
	cmd.Env = CleanEnv("DEPLOYD_SOCKET=" + a.Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var mu sync.Mutex
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &stdout}, lockedWriter{&mu, &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	printed := func() map[int]map[int]int {
		out := map[int]map[int]int{}
		for _, m := range tickRe.FindAllStringSubmatch(syncRead(&mu, &stdout), -1) {
			pid, _ := strconv.Atoi(m[2])
			n, _ := strconv.Atoi(m[3])
			if out[pid] == nil {
				out[pid] = map[int]int{}
			}
			out[pid][n]++
		}
		return out
	}
	waitTicks := func(what string, want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			p := printed()
			if len(p[before[0]]) >= want && len(p[before[1]]) >= want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: logs -f printed %d and %d tick lines of the two workers, want %d; stderr %q",
					what, len(p[before[0]]), len(p[before[1]]), want, syncRead(&mu, &stderr))
			}
		}
	}
	waitTicks("before the upgrades", 5)
	for _, kind := range []string{"cli", "sighup", "binary"} {
		upgradeBy(t, a, kind)
		p := printed()
		waitTicks("after the "+kind+" upgrade", max(len(p[before[0]]), len(p[before[1]]))+10)
	}
	a.Stop()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("logs -f after the agent stopped: %v, want exit 1", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("logs -f still runs 15s after the agent stopped")
	}
	if want := "did it stop or hand over to a new agent?"; !strings.Contains(syncRead(&mu, &stderr), want) {
		t.Errorf("logs -f stderr %q lacks %q", syncRead(&mu, &stderr), want)
	}
	// From the first line it printed of each worker on, every one once.
	for _, pid := range before {
		c := printed()[pid]
		lo, hi := 1<<30, 0
		for n := range c {
			lo, hi = min(lo, n), max(hi, n)
		}
		var missing, dup []int
		for n := lo; n <= hi; n++ {
			switch c[n] {
			case 0:
				missing = append(missing, n)
			case 1:
			default:
				dup = append(dup, n)
			}
		}
		if len(missing)+len(dup) > 0 {
			t.Errorf("worker %d: logs -f across 3 upgrades printed ticks %d..%d with %v missing, %v twice", pid, lo, hi, missing, dup)
		} else {
			t.Logf("worker %d: logs -f across 3 upgrades printed ticks %d..%d, each once", pid, lo, hi)
		}
	}
}

// lockedWriter guards a buffer that a command writes while the test reads.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func syncRead(mu *sync.Mutex, b *bytes.Buffer) string {
	mu.Lock()
	defer mu.Unlock()
	return b.String()
}
