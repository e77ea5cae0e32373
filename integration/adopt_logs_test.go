package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestLogsFollowAcrossAnUpgrade: a `deployd logs -f` that runs while the
// agent upgrades ends, saying why, with exit 1 (the old agent closes its
// streams; a follow does not reconnect by itself); one started against the
// new agent prints the adopted workers' new lines.
func TestLogsFollowAcrossAnUpgrade(t *testing.T) {
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

	tick := regexp.MustCompile(`tick \d+ \d+ \d+`)
	for deadline := time.Now().Add(10 * time.Second); !tick.MatchString(syncRead(&mu, &stdout)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("logs -f printed no tick line within 10s; stderr %q", syncRead(&mu, &stderr))
		}
	}
	upgradeBy(t, a, "cli")
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("logs -f across the upgrade: %v, want exit 1", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("logs -f still runs 15s after the agent it followed exited")
	}
	if want := "did it stop or hand over to a new agent?"; !strings.Contains(syncRead(&mu, &stderr), want) {
		t.Errorf("logs -f stderr %q lacks %q", syncRead(&mu, &stderr), want)
	}

	// Against the new agent: the adopted workers' lines, newer than the
	// upgrade, for both of them.
	f := startFollower(t, a, "web", "-f", "-n", "0")
	for slot, pid := range before {
		re := regexp.MustCompile(fmt.Sprintf(`tick %d %d \d+$`, slot, pid))
		f.waitCount(t, fmt.Sprintf("adopted worker %d", pid), re, 5, 10*time.Second)
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
