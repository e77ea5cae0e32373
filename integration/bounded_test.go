package integration

// Bounded reads of what another party controls: a rollback's version, the
// records in a release folder the app's user can write, a client's
// artifact stream that never comes, an oversized config or binary.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// within is a context for one control call of a test.
func within(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// deployPath deploys the artifact folder path as version, by path (root).
func deployPath(t *testing.T, a *Agent, path, version string) {
	t.Helper()
	res, err := a.Client.Deploy(within(t, time.Minute), api.DeployRequest{App: "web", Artifact: path, Version: version}, nil, nil)
	if err != nil || res.Status != api.DeployDeployed {
		t.Fatalf("deploy %s: %+v, %v\n%s", version, res, err, a.Log())
	}
}

// A rollback's --to is a version of the app installed on this host, never
// a path: "../../x" (whatever x holds; here a FIFO where the record would
// be, which held the app's lock forever) is refused at once, naming the
// problem and the fix, and nothing changes. A FIFO or a link to /dev/zero
// the app's user puts in a release folder as its record changes nothing
// either: releases and rollback answer from the agent's own records.
func TestRollbackToIsAnInstalledVersion(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 1))
	deployPath(t, a, artifactDir(t, "1.0.0", false), "1.0.0")
	deployPath(t, a, artifactDir(t, "2.0.0", false), "2.0.0")
	state := func() []byte {
		b, err := os.ReadFile(filepath.Join(a.Dir, "state", "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before, pids := state(), PIDs(a.App("web"))

	// x is two levels above the app's releases folder: state/x.
	x := filepath.Join(a.Dir, "state", "x")
	if err := os.MkdirAll(x, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(x, ".deployd-release.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"../../x", "../1.0.0", "/etc", "3.0.0"} {
		t0 := time.Now()
		_, err := a.Client.Rollback(within(t, 10*time.Second), api.RollbackRequest{App: "web", To: to}, nil)
		t.Logf("rollback --to %s: answered in %s", to, time.Since(t0).Round(time.Microsecond))
		var se *api.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("rollback --to %s: %v; want a refusal within 10s", to, err)
		}
		for _, want := range []string{"rollback refused, nothing changed", "deployd releases web"} {
			if !strings.Contains(se.Message, want) {
				t.Errorf("rollback --to %s: %q lacks %q", to, se.Message, want)
			}
		}
		if to == "3.0.0" && !strings.Contains(se.Message, "no release 3.0.0 of web") ||
			to != "3.0.0" && !strings.Contains(se.Message, "use letters, digits") {
			t.Errorf("rollback --to %s: %q does not name the problem", to, se.Message)
		}
	}
	if after := state(); string(after) != string(before) {
		t.Errorf("a refused rollback changed state.json:\n%s\n->\n%s", before, after)
	}
	if after := PIDs(a.App("web")); !reflect.DeepEqual(after, pids) {
		t.Errorf("a refused rollback changed the workers: %v -> %v", pids, after)
	}

	// What the app's user may put in a release folder as its record.
	rel1 := filepath.Join(a.Dir, "state", "releases", "web", "1.0.0", ".deployd-release.json")
	rel2 := filepath.Join(a.Dir, "state", "releases", "web", "2.0.0", ".deployd-release.json")
	os.Remove(rel1)
	os.Remove(rel2)
	if err := syscall.Mkfifo(rel1, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", rel2); err != nil {
		t.Fatal(err)
	}
	rs, err := a.Client.Releases(within(t, 10*time.Second), "web")
	if err != nil || len(rs.Releases) != 2 {
		t.Fatalf("releases with a FIFO and a /dev/zero link in the release folders: %+v, %v", rs, err)
	}
	res, err := a.Client.Rollback(within(t, time.Minute), api.RollbackRequest{App: "web", To: "1.0.0"}, nil)
	if err != nil || res.Status != api.DeployRolledBack {
		t.Fatalf("rollback to 1.0.0: %+v, %v\n%s", res, err, a.Log())
	}
}

// A deploy cut short (agent killed mid-install) leaves a staging folder;
// the next agent removes it when it starts, and keeps the releases.
func TestAgentStartRemovesStagingLeftovers(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 1))
	deployPath(t, a, artifactDir(t, "1.0.0", false), "1.0.0")
	a.Stop()
	left := filepath.Join(a.Dir, "state", "releases", "web", ".tmp-cut-short")
	if err := os.MkdirAll(filepath.Join(left, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.Start()
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staging leftover is still there after a start: %v", err)
	}
	rs, err := a.Client.Releases(within(t, 10*time.Second), "web")
	if err != nil || len(rs.Releases) != 1 || rs.Releases[0].Version != "1.0.0" {
		t.Errorf("releases after the start: %+v, %v", rs, err)
	}
}

// A client that passes a pipe as its artifact and never writes it holds
// the app's lock only until stream_timeout: the deploy is refused, naming
// why, and root's restart, which it made "busy", then works.
func TestDeployOfAPipeNeverWrittenGivesUp(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, "stream_timeout = \"2s\"\n\n"+releasesApp(port, 1))
	deployPath(t, a, artifactDir(t, "1.0.0", false), "1.0.0")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // open, never written
	t0 := time.Now()
	_, err = a.Client.Deploy(within(t, 30*time.Second),
		api.DeployRequest{App: "web", Kind: "tar.gz", Name: "app.tar.gz", Version: "2.0.0"}, r, nil)
	took := time.Since(t0)
	var se *api.StatusError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "sent nothing for 2s") {
		t.Fatalf("deploy of a pipe never written: %v after %s; want a refusal after stream_timeout\n%s", err, took, a.Log())
	}
	t.Logf("deploy of a pipe never written refused after %s (stream_timeout 2s): %s", took.Round(time.Millisecond), se.Message)
	res, err := a.Client.Restart(within(t, time.Minute), "web", nil)
	if err != nil || !res.OK {
		t.Fatalf("restart after the refused deploy: %+v, %v", res, err)
	}
	if rs, err := a.Client.Releases(within(t, 10*time.Second), "web"); err != nil || len(rs.Releases) != 1 {
		t.Errorf("releases after the refused deploy: %+v, %v; want 1.0.0 only", rs, err)
	}
}

// sparseFile makes a file of size bytes that takes no disk (all zeros: one
// line of NUL bytes for a TOML parser).
func sparseFile(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// vmHWM is the peak resident set of pid, in KiB.
func vmHWM(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// `config check` on an oversized config refuses it at once, with bounded
// memory, and quotes little of it; a config within the size limit holding
// a line of almost a megabyte is quoted as a window of that line. The
// agent's reload of an oversized config is refused the same way, and the
// agent does not grow.
func TestOversizedConfigRefusedFast(t *testing.T) {
	a := NewAgentDir(t, bins, appConfig("web", FreePort(t), 1, ""))
	dir := t.TempDir()
	longLine := filepath.Join(dir, "long-line.toml")
	if err := os.WriteFile(longLine, []byte("[agent]\nsocket = \"/s\" "+strings.Repeat("x", 1<<20-100)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mib64, gib2 := filepath.Join(dir, "64MiB.toml"), filepath.Join(dir, "2GiB.toml")
	sparseFile(t, mib64, 64<<20)
	sparseFile(t, gib2, 2<<30)
	for _, path := range []string{longLine, mib64, gib2} { // on a failure, stop before the larger
		t0 := time.Now()
		maxrss, stderr, err := runMaxRSS(t, 30*time.Second, bins.Deployd, "config", "check", "-c", path)
		took := time.Since(t0)
		t.Logf("config check of %s: %s, max RSS %d KiB, %d bytes on stderr", filepath.Base(path), took.Round(time.Millisecond), maxrss, stderr.Len())
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("config check of %s: %v; want exit 2", path, err)
		}
		// runMaxRSS starts it from a small helper process: a child's max
		// RSS starts from its parent's (exec keeps the high-water mark),
		// and this test process grows to hundreds of MiB beside the
		// parallel tests. Reading the 64 MiB file took 633 MB before the
		// fix.
		if stderr.Len() > 4<<10 || maxrss > 192<<10 || took > 10*time.Second {
			t.Fatalf("config check of %s: %s, max RSS %d KiB, stderr %d bytes; want a short refusal in bounded memory:\n%.400s",
				path, took, maxrss, stderr.Len(), stderr.String())
		}
	}

	a.Start()
	hwm := vmHWM(t, a.PID())
	big, err := os.ReadFile(a.Config)
	if err != nil {
		t.Fatal(err)
	}
	sparseFile(t, a.Config, 64<<20)
	t0 := time.Now()
	_, err = a.Client.Reload(within(t, 30*time.Second), api.ReloadRequest{}, nil)
	var se *api.StatusError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "too large") || len(se.Message) > 4<<10 {
		t.Fatalf("reload of a 64 MiB config: %v; want a short refusal", err)
	}
	after := vmHWM(t, a.PID())
	t.Logf("reload of a 64 MiB config refused in %s; agent peak RSS %d KiB before, %d KiB after",
		time.Since(t0).Round(time.Millisecond), hwm, after)
	if after > hwm+16<<10 {
		t.Errorf("the agent's peak RSS grew from %d to %d KiB on a refused reload", hwm, after)
	}
	if err := os.WriteFile(a.Config, big, 0o644); err != nil { // for the agent's stop
		t.Fatal(err)
	}
}

// A member's `upgrade --binary` that the agent refuses whatever the binary
// (no upgrade_public_key to check a member's signature) is refused before
// the agent reads it: the agent does not grow by the binary's 100 MiB.
func TestMemberUpgradeRefusedBeforeReading(t *testing.T) {
	m := newMember(t)
	a := startMemberAgent(t, m, "", appConfig("web", FreePort(t), 1, ""))
	big := filepath.Join(m.Dir(t), "deployd-big")
	sparseFile(t, big, 100<<20)
	if err := os.Chmod(big, 0o755); err != nil {
		t.Fatal(err)
	}
	m.Own(t, big)
	hwm := vmHWM(t, a.PID())
	cmd := exec.CommandContext(within(t, time.Minute), bins.Deployd, "upgrade", "--binary", big)
	cmd.Env = CleanEnv("DEPLOYD_SOCKET=" + a.Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.Cred}
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(t0)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "no [agent] upgrade_public_key") {
		t.Fatalf("member's upgrade: %v; want exit 1 naming the missing key:\n%s", err, out)
	}
	after := vmHWM(t, a.PID())
	t.Logf("member's upgrade of a 100 MiB binary refused in %s; agent peak RSS %d KiB before, %d KiB after",
		took.Round(time.Millisecond), hwm, after)
	if after > hwm+16<<10 {
		t.Errorf("the agent's peak RSS grew from %d to %d KiB on a refused upgrade", hwm, after)
	}
}
