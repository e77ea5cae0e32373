package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/deployd/deployd/agent/api"
)

// agentPID is the pid answering the control socket.
func agentPID(t *testing.T, a *Agent) (int, string) {
	t.Helper()
	ctx, cancel := a.Ctx(0)
	defer cancel()
	v, err := a.Client.Version(ctx)
	if ctx.Err() != nil {
		a.Stuck("version", err)
	}
	if err != nil {
		t.Fatalf("version: %v\n%s", err, a.Log())
	}
	return v.PID, v.Version
}

func workerPIDs(st *api.Status) []int {
	var out []int
	for _, app := range st.Apps {
		for _, w := range app.Workers {
			out = append(out, w.PID)
		}
	}
	return out
}

func TestUpgradesUnderLoadDropNothing(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, versionedApp(port, 2, "v1", "", ""))
	a.UseOwnBinary()
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	stop := startLoad(t, port, 50, 3*time.Minute)
	var oldProcs []int
	want := ""
	for i := 1; i <= 5; i++ {
		src, ver := bins.DeploydV2, "test-2"
		if i%2 == 0 {
			src, ver = bins.Deployd, "test-1"
		}
		want = ver
		pid, _ := agentPID(t, a)
		oldProcs = append(oldProcs, pid)
		workersBefore := fmt.Sprint(workerPIDs(a.Status()))
		// The candidate lives outside the agent's path; the agent copies it in.
		cand := filepath.Join(t.TempDir(), "deployd-new")
		CopyFile(t, src, cand)
		r := a.CLI("upgrade", "--binary", cand, "--json")
		if r.Code != 0 {
			t.Fatalf("upgrade %d: exit %d\n%s%s\nagent log:\n%s", i, r.Code, r.Stdout, r.Stderr, a.Log())
		}
		if !strings.Contains(r.Stdout, `"new_version":"`+ver+`"`) {
			t.Errorf("upgrade %d output lacks the new version %s: %s", i, ver, r.Stdout)
		}
		npid, nver := agentPID(t, a)
		if npid == pid || nver != ver {
			t.Fatalf("after upgrade %d: agent pid %d version %s (before: pid %d)", i, npid, nver, pid)
		}
		// The new agent adopts the running workers: the same pids.
		st := a.WaitFor("workers ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
		if after := fmt.Sprint(workerPIDs(st)); after != workersBefore {
			t.Errorf("upgrade %d: workers %s, want the adopted %s", i, after, workersBefore)
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	if _, v := agentPID(t, a); v != want {
		t.Errorf("final agent version %s, want %s", v, want)
	}
	// Every old agent is gone.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range oldProcs {
		for Alive(p) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if Alive(p) {
			t.Errorf("process %d of an old agent is still running", p)
		}
	}
	if b, _ := os.ReadFile(a.Binary); !bytes.Equal(b, mustRead(t, bins.DeploydV2)) {
		t.Errorf("the agent's binary is not the last one installed")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// script writes an executable shell script.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-deployd")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRefusedUpgradesKeepOldAgent(t *testing.T) {
	parallel(t)
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubText, _ := pub.MarshalText()
	port := FreePort(t)
	base := versionedApp(port, 1, "v1", "", "")
	a := NewAgentDir(t, bins, fmt.Sprintf("upgrade_timeout = \"4s\"\nupgrade_public_key = %q\n", pubText))
	// The [agent] extras must be in the [agent] table: rewrite by hand.
	writeAgentConfig := func(app string) {
		head := fmt.Sprintf("[agent]\nsocket = %q\nstate_dir = \"state\"\nlog_dir = \"logs\"\nupgrade_timeout = \"4s\"\nupgrade_public_key = %q\n\n",
			a.Socket, pubText)
		body := strings.ReplaceAll(app, "%TESTAPP%", bins.TestApp)
		if err := os.WriteFile(a.Config, []byte(head+body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeAgentConfig(base)
	a.UseOwnBinary()
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	pid0, _ := agentPID(t, a)
	orig := mustRead(t, a.Binary)

	v2 := filepath.Join(t.TempDir(), "deployd-v2")
	CopyFile(t, bins.DeploydV2, v2)
	sign := func(path string) string {
		sig := minisign.Sign(priv, mustRead(t, path))
		p := path + ".minisig"
		os.WriteFile(p, sig, 0o644)
		return p
	}
	goodSig := sign(v2)
	otherSig := filepath.Join(t.TempDir(), "other.minisig")
	os.WriteFile(otherSig, minisign.Sign(priv, []byte("something else")), 0o644)
	notExec := filepath.Join(t.TempDir(), "deployd-noexec")
	os.WriteFile(notExec, mustRead(t, bins.DeploydV2), 0o644)
	exitsAtOnce := script(t, `[ "$1" = version ] && { echo "deployd fake-1"; exit 0; }; exit 1`)
	hangs := script(t, `[ "$1" = version ] && { echo "deployd fake-2"; exit 0; }; exec sleep 600`)
	signed := func(p string) []string { return []string{"--signature", sign(p)} }

	for _, tc := range []struct {
		name string
		args []string
		want string
		app  string // config to write before, restored after
	}{
		{"sha256 mismatch", append([]string{"--binary", v2, "--sha256", fmt.Sprintf("%x", sha256.Sum256([]byte("x")))}, "--signature", goodSig), "sha256 mismatch", ""},
		{"signature missing", []string{"--binary", v2}, "signature is required", ""},
		{"bad signature", []string{"--binary", v2, "--signature", otherSig}, "does not verify", ""},
		{"not executable", append([]string{"--binary", notExec}, signed(notExec)...), "not executable", ""},
		{"missing file", []string{"--binary", "/nonexistent/deployd"}, "no such file", ""},
		{"exits at once", append([]string{"--binary", exitsAtOnce}, signed(exitsAtOnce)...), "previous binary is restored", ""},
		{"hangs past timeout", append([]string{"--binary", hangs}, signed(hangs)...), "previous binary is restored", ""},
		{"workers never ready", append([]string{"--binary", v2}, "--signature", goodSig), "previous binary is restored",
			versionedApp(port, 1, "v1", `TESTAPP_NEVER_READY = "true"`, `ready_timeout = "1s"`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.app != "" {
				writeAgentConfig(tc.app)
				defer writeAgentConfig(base)
			}
			before := workerPIDs(a.Status())
			r := a.CLI(append([]string{"upgrade"}, tc.args...)...)
			if r.Code != 1 || !strings.Contains(r.Stderr, tc.want) {
				t.Errorf("exit %d, want 1 with %q:\n%s", r.Code, tc.want, r.Stderr)
			}
			if pid, _ := agentPID(t, a); pid != pid0 {
				t.Errorf("agent pid %d, want the old %d", pid, pid0)
			}
			if !bytes.Equal(mustRead(t, a.Binary), orig) {
				t.Errorf("the agent's binary changed after a refused upgrade")
			}
			if after := workerPIDs(a.Status()); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("workers changed: %v -> %v", before, after)
			}
			if _, err := get(t, port, "/"); err != nil {
				t.Errorf("old agent not serving: %v", err)
			}
		})
	}
	// Finally a good, signed upgrade goes through.
	if r := a.CLI("upgrade", "--binary", v2, "--signature", goodSig); r.Code != 0 {
		t.Fatalf("signed upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	if _, v := agentPID(t, a); v != "test-2" {
		t.Errorf("after the signed upgrade the agent is %s", v)
	}
}

func TestSIGHUPWithInvalidConfigKeepsServing(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, versionedApp(port, 1, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	pid0, _ := agentPID(t, a)
	a.WriteConfig(versionedApp(port, 1, "v1", "", `stop_signal = "SIGWHAT"`))
	a.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(a.Log(), "config on disk is invalid") {
		if time.Now().After(deadline) {
			t.Fatalf("agent did not log why it refused the SIGHUP upgrade:\n%s", a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(a.Log(), "stop_signal") {
		t.Errorf("the log should name the bad key:\n%s", a.Log())
	}
	if pid, _ := agentPID(t, a); pid != pid0 {
		t.Errorf("agent changed: pid %d, want %d", pid, pid0)
	}
	if _, err := get(t, port, "/"); err != nil {
		t.Errorf("not serving: %v", err)
	}
	// With the config fixed, SIGHUP hands off to a new agent.
	a.WriteConfig(versionedApp(port, 1, "v1", "", ""))
	a.Signal(syscall.SIGHUP)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if pid, _ := agentPID(t, a); pid != pid0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not hand off:\n%s", a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.WaitFor("ready after handoff", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
}
