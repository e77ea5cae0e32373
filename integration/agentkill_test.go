package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestAgentKillLeavesNoOrphansAndRestartsClean SIGKILLs the agent: no
// cleanup code runs; its workers serve on (they outlive agents) and the
// next agent must adopt them (the same pids, with the state it had: web
// scaled to 3), and cope with what was left on disk: a stale control
// socket file, a stale unix socket of an app, and state.json.
func TestAgentKillLeavesNoOrphansAndRestartsClean(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, "")+`[apps.side]
command = ["%TESTAPP%"]
instances = 1
listen = ["unix://%DIR%/side.sock"]
`)
	side := filepath.Join(a.Dir, "side.sock")
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) && AllReady(st, "side", 1) })
	// State the next agent must bring back: web scaled from 2 (config) to 3.
	if r := a.CLI("scale", "web", "3"); r.Code != 0 {
		t.Fatalf("scale 3: exit %d\n%s", r.Code, r.Stderr)
	}
	old := allWorkerPIDs(a.WaitFor("3 ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 3) }))
	oldAgent := a.PID()

	if err := syscall.Kill(oldAgent, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	a.AwaitExit(t)
	// The workers outlive it (no Pdeathsig: a next agent adopts or retires
	// them) and keep serving while no agent runs.
	for pid := range old {
		if !Alive(pid) {
			t.Errorf("worker %d died with the agent", pid)
		}
	}
	if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "version=") {
		t.Errorf("GET / with no agent running: %q, %v", body, err)
	}
	var stale []string
	for _, p := range []string{a.Socket, side} {
		if _, err := os.Lstat(p); err == nil {
			stale = append(stale, filepath.Base(p))
		}
	}
	t.Logf("agent SIGKILLed after %s: its %d workers serve on; stale socket files left: %v",
		time.Since(t0).Round(time.Millisecond), len(old), stale)

	// A new agent on the same folder: same config, state and socket paths.
	t1 := time.Now()
	a.Start()
	st := a.WaitFor("web 3 and side 1 ready after the restart", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 3) && AllReady(st, "side", 1)
	})
	t.Logf("new agent serving %s after its start", time.Since(t1).Round(time.Millisecond))
	// The sockets it took back from the survivors are logged as theirs.
	if log := a.Log(); strings.Contains(log, "systemd socket activation") || !strings.Contains(log, "adopted socket from a worker left by a dead agent") {
		t.Errorf("the new agent's log words the sockets it took back from survivors wrongly:\n%s", log)
	}
	if st.Agent.PID == oldAgent {
		t.Fatalf("status answered by the killed agent's pid %d", oldAgent)
	}
	// It adopts the killed agent's workers: no signal, the same pids.
	fresh := allWorkerPIDs(st)
	if !maps.Equal(fresh, old) {
		t.Fatalf("workers %v under the new agent, %v under the killed one: not adopted\n%s", keys(fresh), keys(old), a.Log())
	}
	if r := appOf(st, "web").Restarts; r != 0 {
		t.Errorf("web: %d restarts after the adoption", r)
	}
	// Only the new workers answer on the port.
	for i := 0; i < 200; i++ {
		body, err := get(t, port, "/")
		if err != nil {
			t.Fatalf("GET / after the restart: %v", err)
		}
		var ver string
		var pid, slot int
		if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &pid, &slot); err != nil || !fresh[pid] {
			t.Fatalf("answer %q is not from a worker the new agent supervises %v", body, fresh)
		}
	}
	if body, err := getUnix(side); err != nil || !strings.HasPrefix(body, "version=") {
		t.Errorf("GET on %s after the restart: %q, %v", side, body, err)
	}
	if r := a.CLI("status"); r.Code != 0 {
		t.Errorf("status through the replaced control socket: exit %d\n%s", r.Code, r.Stderr)
	}
}

// allWorkerPIDs is the set of pids of every app's workers.
func allWorkerPIDs(st *api.Status) map[int]bool {
	m := map[int]bool{}
	for _, app := range st.Apps {
		for _, w := range app.Workers {
			m[w.PID] = true
		}
	}
	return m
}

// waitAllGone fails the test unless every pid exits within bound.
func waitAllGone(t *testing.T, pids map[int]bool, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		var alive []int
		for pid := range pids {
			if Alive(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers %v still alive %s after the agent was SIGKILLed: orphans serving stale code", alive, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitRefused fails the test unless a connect to port is refused within
// bound. Alive says a Go worker is gone once its main thread is a zombie,
// but its other threads may hold the fd table a moment longer: a connect in
// that window is queued, then reset when the listener closes. So poll.
func waitRefused(t *testing.T, port int, bound time.Duration) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var c net.Conn
		c, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
	}
	t.Errorf("port %d still not refusing connections %s after the agent and its workers are gone: last dial: %v", port, bound, err)
}

// getUnix fetches / from an HTTP server on the unix socket path.
func getUnix(path string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
	resp, err := c.Get("http://side/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
