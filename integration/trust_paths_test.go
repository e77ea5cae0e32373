package integration

// Paths an app's user or a member can change are input: the agent follows
// no link in them and refuses folders others can write (issue 39, items 4
// and 5; internal/safeopen).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// asMember runs a shell command as m, failing the test if it fails.
func asMember(t *testing.T, m *member, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.Cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as %s: %s: %v\n%s", m.Name, script, err, out)
	}
}

// rootSecretFile is a 0600 file in a 0700 folder only root can read: what
// another app keeps, or root's own. It returns the folder and the file.
func rootSecretFile(t *testing.T, name, body string) (string, string) {
	t.Helper()
	dir := rootOnlyDir(t, 0o700)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, p
}

// wantFolderRefusal checks that out refuses key's folder dir, naming its
// owner and the fix.
func wantFolderRefusal(t *testing.T, what, out, key, dir string, m *member) {
	t.Helper()
	for _, want := range []string{key, "folder " + dir + " (owner uid " + fmt.Sprint(m.UID) + " (" + m.Name + ")", "mode drwxr-xr-x (0755)",
		"fix: chown root " + dir + " and chmod go-w " + dir} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: the refusal lacks %q:\n%s", what, want, out)
		}
	}
}

// The app's user owns a folder on the env_file's path and swaps it for a
// link into a root-only folder holding another app's env_file: the reload
// is refused, naming the folder and the fix, and no worker gets the secret.
func TestEnvFileThroughSwappedFolderRefused(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	victim, _ := rootSecretFile(t, "web.env", "TOKEN=other-apps-secret\n")
	owned := m.Dir(t)
	appDir := filepath.Join(owned, "app")
	if err := os.Mkdir(appDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(appDir, "web.env"), []byte("TOKEN=webs-own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := func(ver, extra string) string {
		return versionedApp(port, 1, ver, "", fmt.Sprintf("user = %q\n%s", m.Name, extra))
	}
	a := StartAgent(t, bins, app("v1", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	before := PIDs(appOf(st, "web"))

	asMember(t, m, fmt.Sprintf("mv %s %s.old && ln -s %s %s", appDir, appDir, victim, appDir))
	a.WriteConfig(app("v2", fmt.Sprintf("env_file = %q", filepath.Join(appDir, "web.env"))))
	r := a.CLIWithin(30*time.Second, "reload", "web")
	if r.Code == 0 {
		t.Errorf("reload with an env_file behind the app user's folder: exit 0\n%s", r.Stdout)
	}
	wantFolderRefusal(t, "reload", r.Stderr, "apps.web.env_file", owned, m)
	check := a.CLIWithin(30*time.Second, "config", "check", "-c", a.Config)
	if check.Code != 2 {
		t.Errorf("config check: exit %d, want 2\n%s%s", check.Code, check.Stdout, check.Stderr)
	}
	wantFolderRefusal(t, "config check", check.Stderr, "apps.web.env_file", owned, m)
	after := appOf(a.Status(), "web")
	if fmt.Sprint(PIDs(after)) != fmt.Sprint(before) {
		t.Errorf("the refused reload changed web's workers: %v -> %v", before, PIDs(after))
	}
	for _, pid := range PIDs(after) {
		if env := strings.Join(environOf(t, pid), "\n"); strings.Contains(env, "other-apps-secret") {
			t.Errorf("worker %d has the other app's secret:\n%s", pid, env)
		}
	}
}

// A log_dir the app's user owns, with links to a root file where the log
// files go: config check and agent start refuse it with the same words,
// and the root file is untouched.
func TestUserOwnedLogDirRefused(t *testing.T) {
	parallel(t)
	m := newMember(t)
	_, secret := rootSecretFile(t, "secret", "root's secret\n")
	a := NewAgentDir(t, bins, versionedApp(FreePort(t), 1, "v1", "", fmt.Sprintf("user = %q", m.Name)))
	logs := filepath.Join(a.Dir, "logs") // the harness's log_dir
	if err := os.Mkdir(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	m.Own(t, logs)
	asMember(t, m, fmt.Sprintf("ln -s %s %s/web.out.log && ln -s %s %s/web.err.log", secret, logs, secret, logs))

	check := a.CLIWithin(30*time.Second, "config", "check", "-c", a.Config)
	if check.Code != 2 {
		t.Errorf("config check: exit %d, want 2\n%s%s", check.Code, check.Stdout, check.Stderr)
	}
	wantFolderRefusal(t, "config check", check.Stderr, "agent.log_dir", logs, m)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.Binary, "agent", "-c", a.Config)
	cmd.Dir = a.Dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // a running agent stops its workers
	cmd.WaitDelay = 10 * time.Second
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Errorf("the agent started with a log_dir the app's user owns:\n%s", out)
	}
	if err == nil {
		t.Errorf("agent start: exit 0, want a refusal\n%s", out)
	}
	wantFolderRefusal(t, "agent start", string(out), "agent.log_dir", logs, m)
	if b, err := os.ReadFile(secret); err != nil || string(b) != "root's secret\n" {
		t.Errorf("the root file behind the links changed: %q, %v", b, err)
	}
}

// A log folder that became a member's while the agent runs (a chown by
// mistake): links the member puts in place of the current and a rotated
// log file are never read for `deployd logs --err` nor written through.
func TestMemberLogsNeverReadThroughALink(t *testing.T) {
	parallel(t)
	m := newMember(t)
	_, secret := rootSecretFile(t, "secret", "root's secret\n")
	a := startMemberAgent(t, m, "", versionedApp(FreePort(t), 1, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	logs := filepath.Join(a.Dir, "logs")
	m.Own(t, logs)
	asMember(t, m, fmt.Sprintf("rm -f %[1]s/web.err.log && ln -s %[2]s %[1]s/web.err.log && ln -s %[2]s %[1]s/web.err-2026-01-01T00-00-00.000.log", logs, secret))

	r := a.CLIAs(m.Cred, "logs", "web", "--err", "-n", "100")
	t.Logf("logs --err: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	if strings.Contains(r.Stdout+r.Stderr, "root's secret") {
		t.Errorf("a member's logs --err printed a root-only file through a link")
	}
	if r := a.CLIAs(m.Cred, "logs", "web", "--rotate"); r.Code != 0 {
		t.Errorf("logs --rotate: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLIWithin(60*time.Second, "restart", "web"); r.Code != 0 {
		t.Errorf("restart: exit %d\n%s", r.Code, r.Stderr)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "root's secret\n" {
		t.Errorf("the root file behind the links was written: %q, %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(logs, "web.err.log")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("after the rotation web.err.log is %v, %v; want a file of the agent's", fi, err)
	}
}

// The app's user owns the folder a unix listener is configured in and
// swaps it for a link into a root-only 0700 folder: config check refuses
// it before and after the swap, and so does the reload, naming the folder
// and the fix; root binds nothing, so nothing appears in the root folder,
// and the workers serve on as they were.
func TestUnixListenerInSwappedFolderRefused(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	victim := rootOnlyDir(t, 0o700)
	inVictim := func() string {
		ents, err := os.ReadDir(victim)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	was := inVictim()
	owned := m.Dir(t)
	run := filepath.Join(owned, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	m.Own(t, run)
	sock := filepath.Join(run, "web.sock")
	app := func(ver, listen string) string {
		return fmt.Sprintf("[apps.web]\ncommand = [\"%%TESTAPP%%\"]\ninstances = 1\nlisten = [\"tcp://127.0.0.1:%d\"%s]\n"+
			"user = %q\nenv = { TESTAPP_VERSION = %q }\nready_timeout = \"10s\"\nstop_timeout = \"10s\"\n", port, listen, m.Name, ver)
	}
	a := StartAgent(t, bins, app("v1", ""))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	before := PIDs(appOf(st, "web"))

	a.WriteConfig(app("v2", fmt.Sprintf(", \"unix://%s\"", sock)))
	check := a.CLIWithin(30*time.Second, "config", "check", "-c", a.Config)
	if check.Code != 2 {
		t.Errorf("config check of a listener in the app user's folder: exit %d, want 2\n%s%s", check.Code, check.Stdout, check.Stderr)
	}
	wantFolderRefusal(t, "config check", check.Stderr, "apps.web.listen", owned, m)

	asMember(t, m, fmt.Sprintf("mv %s %s.old && ln -s %s %s", run, run, victim, run))
	r := a.CLIWithin(30*time.Second, "reload", "web")
	t.Logf("deployd reload web: exit %d\n%s", r.Code, r.Stderr)
	if r.Code == 0 {
		t.Errorf("reload with a unix listener behind the app user's link: exit 0\n%s", r.Stdout)
	}
	wantFolderRefusal(t, "reload", r.Stderr, "apps.web.listen", owned, m)
	if !strings.Contains(r.Stderr, "put the socket in a folder only root can write") {
		t.Errorf("the reload's refusal lacks the way out:\n%s", r.Stderr)
	}
	check = a.CLIWithin(30*time.Second, "config", "check", "-c", a.Config)
	if check.Code != 2 {
		t.Errorf("config check after the swap: exit %d, want 2\n%s%s", check.Code, check.Stdout, check.Stderr)
	}
	wantFolderRefusal(t, "config check after the swap", check.Stderr, "apps.web.listen", owned, m)

	if now := inVictim(); now != was {
		t.Errorf("root made something in the root-only folder behind the link: %q, was %q", now, was)
	}
	after := appOf(a.Status(), "web")
	if fmt.Sprint(PIDs(after)) != fmt.Sprint(before) {
		t.Errorf("the refused reload changed web's workers: %v -> %v", before, PIDs(after))
	}
	if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "version=v1 ") {
		t.Errorf("web after the refused reload: %q, %v", body, err)
	}
}
