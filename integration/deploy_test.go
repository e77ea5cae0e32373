package integration

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// releasesApp is an app that takes releases: ./run in the release folder.
func releasesApp(port, instances int) string {
	return fmt.Sprintf(`[apps.web]
command = ["./run"]
releases = true
keep_releases = 3
instances = %d
listen = ["tcp://127.0.0.1:%d"]
ready_timeout = "5s"
stop_timeout = "10s"
`, instances, port)
}

// artifactDir makes a release folder: the test app, and a ./run script that
// starts it with the given version (or exits 3 when broken).
func artifactDir(t *testing.T, version string, broken bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "release-"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	CopyFile(t, bins.TestApp, filepath.Join(dir, "server"))
	run := fmt.Sprintf("#!/bin/sh\nexec ./server -version %s\n", version)
	if broken {
		run = "#!/bin/sh\necho \"missing DATABASE_URL\" >&2\nexit 3\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte(run), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func releaseStatus(t *testing.T, a *Agent) map[string]string {
	t.Helper()
	r := a.CLI("releases", "web", "--json")
	if r.Code != 0 {
		t.Fatalf("releases: exit %d: %s", r.Code, r.Stderr)
	}
	var rs api.Releases
	if err := json.Unmarshal([]byte(r.Stdout), &rs); err != nil {
		t.Fatalf("releases --json: %v: %s", err, r.Stdout)
	}
	m := map[string]string{}
	for _, rel := range rs.Releases {
		m[rel.Version] = rel.Status
	}
	return m
}

func requireVersion(t *testing.T, a *Agent, port int, want string) {
	t.Helper()
	app := a.App("web")
	if app.Release != want {
		t.Errorf("app release %q, want %q", app.Release, want)
	}
	for pid, v := range identities(t, port, PIDs(app)) {
		if v != want {
			t.Errorf("worker %d serves %s, want %s", pid, v, want)
		}
	}
}

func TestDeployFailRollbackRestart(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 2))
	if st := a.App("web").State; st != "no release" {
		t.Errorf("before the first deploy, state %q, want \"no release\"", st)
	}
	// First deploy, JSON result shape.
	r := a.CLI("deploy", "web", "--artifact", artifactDir(t, "1.0.0", false), "--version", "1.0.0", "--json")
	if r.Code != 0 {
		t.Fatalf("first deploy: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	var res map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last --json line: %v", err)
	}
	for _, k := range []string{"app", "version", "previous", "status", "duration_seconds"} {
		if _, ok := res[k]; !ok {
			t.Errorf("deploy --json result lacks %q: %v", k, res)
		}
	}
	requireVersion(t, a, port, "1.0.0")

	// Second deploy under load: nothing dropped.
	stop := startLoad(t, port, 50, 2*time.Minute)
	t0 := time.Now()
	r = a.CLI("deploy", "web", "--artifact", artifactDir(t, "2.0.0", false), "--version", "2.0.0")
	t.Logf("deploy of the test app, command to exit: %s", time.Since(t0).Round(time.Millisecond))
	if r.Code != 0 {
		t.Fatalf("deploy 2.0.0: exit %d\n%s", r.Code, r.Stderr)
	}
	requireVersion(t, a, port, "2.0.0")

	// A broken release: exit 1, marked failed, 2.0.0 keeps serving.
	before := PIDs(a.App("web"))
	r = a.CLI("deploy", "web", "--artifact", artifactDir(t, "3.0.0", true), "--version", "3.0.0")
	if r.Code != 1 || !strings.Contains(r.Stderr, "FAILED") || !strings.Contains(r.Stderr, "missing DATABASE_URL") {
		t.Errorf("broken deploy: exit %d, want 1 with the worker's output:\n%s", r.Code, r.Stderr)
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a failed deploy changed the workers: %v -> %v", before, after)
	}
	requireVersion(t, a, port, "2.0.0")
	if st := releaseStatus(t, a); st["3.0.0"] != "failed" || st["2.0.0"] != "current" || st["1.0.0"] != "previous" {
		t.Errorf("release statuses: %v", st)
	}

	// Rollback to the previous good release.
	if r := a.CLI("rollback", "web"); r.Code != 0 {
		t.Fatalf("rollback: exit %d\n%s", r.Code, r.Stderr)
	}
	requireVersion(t, a, port, "1.0.0")
	ka, nka := stop()
	requireNoFailures(t, "keep-alive", ka)
	requireNoFailures(t, "new-connection", nka)
	if st := releaseStatus(t, a); st["1.0.0"] != "current" || st["2.0.0"] != "previous" {
		t.Errorf("after rollback: %v", st)
	}

	// A restarted agent runs the current release again.
	a.Stop()
	a.Start()
	a.WaitFor("ready after restart", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	requireVersion(t, a, port, "1.0.0")
	// And so does a new agent after a handoff.
	a.Signal(syscall.SIGHUP)
	a.WaitFor("handoff", 30*time.Second, func(st *api.Status) bool {
		return st.Agent.PID != a.PID() && AllReady(st, "web", 2)
	})
	requireVersion(t, a, port, "1.0.0")
}

// tarball writes a .tar.gz with the given entries.
func tarball(t *testing.T, entries []*tar.Header, content map[string]string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "artifact.tar.gz")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for _, h := range entries {
		body := content[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if body != "" {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	gz.Close()
	f.Close()
	return p
}

func TestDeployRefusesBadInput(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 1)+appConfig("plain", FreePort(t), 1, ""))
	good := artifactDir(t, "1.0.0", false)
	if r := a.CLI("deploy", "web", "--artifact", good, "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	notExec := filepath.Join(t.TempDir(), "server")
	os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644)
	other := artifactDir(t, "1.0.0-other", false)
	script := "#!/bin/sh\nexec ./server\n"
	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755} }
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"checksum mismatch", []string{"web", "--artifact", good, "--version", "9", "--sha256", strings.Repeat("ab", 32)}, "sha256 mismatch"},
		{"unknown app", []string{"nope", "--artifact", good}, "unknown app"},
		{"missing artifact", []string{"web", "--artifact", "/nonexistent/build.tar.gz"}, "no such file"},
		{"not executable", []string{"web", "--artifact", notExec}, "not executable"},
		{"version exists with other content", []string{"web", "--artifact", other, "--version", "1.0.0"}, "already exists with other content"},
		{"app without releases", []string{"plain", "--artifact", good}, "releases = true"},
		{"tar absolute path", []string{"web", "--artifact", tarball(t, []*tar.Header{reg("/etc/evil")}, map[string]string{"/etc/evil": "x"})}, "absolute path"},
		{"tar dot-dot", []string{"web", "--artifact", tarball(t, []*tar.Header{reg("a/../../evil")}, map[string]string{"a/../../evil": "x"})}, `".."`},
		{"tar link outside", []string{"web", "--artifact", tarball(t, []*tar.Header{
			{Name: "escape", Typeflag: tar.TypeSymlink, Linkname: "../../../etc"}}, nil)}, "points outside the release"},
		{"tar device", []string{"web", "--artifact", tarball(t, []*tar.Header{
			{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o600}}, nil)}, "device"},
		{"tar with a top-level folder", []string{"web", "--artifact", tarball(t, []*tar.Header{
			{Name: "myapp-1.0/", Typeflag: tar.TypeDir, Mode: 0o755}, reg("myapp-1.0/run")}, map[string]string{"myapp-1.0/run": script})},
			"has everything under myapp-1.0/, and the app's command names ./run, which is at myapp-1.0/run: pack the folder's contents (tar -C myapp-1.0 -czf"},
		{"no command in release", []string{"web", "--artifact", tarball(t, []*tar.Header{reg("other")}, map[string]string{"other": script})}, "has no executable ./run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := PIDs(a.App("web"))
			r := a.CLI(append([]string{"deploy"}, tc.args...)...)
			if r.Code != 2 || !strings.Contains(r.Stderr, tc.want) {
				t.Errorf("exit %d, want 2 with %q:\n%s", r.Code, tc.want, r.Stderr)
			}
			if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("workers changed: %v -> %v", before, after)
			}
			if rel := a.App("web").Release; rel != "1.0.0" {
				t.Errorf("current release %q after a refused deploy", rel)
			}
		})
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("a tarball wrote /etc/evil")
	}
	// A deploy while another deploy of the app runs is refused at once.
	slow := artifactDir(t, "2.0.0", false)
	os.WriteFile(filepath.Join(slow, "run"), []byte("#!/bin/sh\nsleep 2\nexec ./server -version 2.0.0\n"), 0o755)
	var first Result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); first = a.CLI("deploy", "web", "--artifact", slow, "--version", "2.0.0") }()
	a.WaitFor("deploy running", 10*time.Second, func(st *api.Status) bool { return appOf(st, "web").State == "reloading" })
	r := a.CLI("deploy", "web", "--artifact", artifactDir(t, "2.1.0", false), "--version", "2.1.0")
	if r.Code != 1 || !strings.Contains(r.Stderr, "another") {
		t.Errorf("concurrent deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLI("reload", "web"); r.Code != 1 || !strings.Contains(r.Stderr, "another") {
		t.Errorf("reload during a deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	wg.Wait()
	if first.Code != 0 {
		t.Errorf("first deploy: exit %d\n%s", first.Code, first.Stderr)
	}
}
