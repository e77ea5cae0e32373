package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// environOf reads /proc/PID/environ: the environment the process started with.
func environOf(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatalf("environ of worker %d: %v", pid, err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func hasVar(env []string, kv string) bool {
	for _, e := range env {
		if e == kv {
			return true
		}
	}
	return false
}

// A secret in the agent's environment (a systemd Environment=, a CI
// variable) reaches no worker and no hook, whether they run as the app's
// user or as root; env_file and env_inherit bring what an app needs, and
// an env_file another user could write is refused with what to do.
func TestAgentSecretsStayWithTheAgent(t *testing.T) {
	parallel(t)
	m := newMember(t) // skips unless root
	port, rootPort := FreePort(t), FreePort(t)
	secret := fmt.Sprintf("agent-secret-%d", time.Now().UnixNano())
	envFile := filepath.Join(t.TempDir(), "web.env")
	if err := os.WriteFile(envFile, []byte("# web's secrets\nDB_PASSWORD=\"from the file\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(hooksApp(port, 2, ""), "# user", fmt.Sprintf(`user = %q
env = { MODE = "prod" }
env_file = %q
env_inherit = ["HTTP_PROXY"]`, m.Name, envFile), 1) + appConfig("plain", rootPort, 1, "") +
		strings.ReplaceAll(strings.ReplaceAll(hooksApp(FreePort(t), 1, ""), "apps.web", "apps.rootweb"), "# user", "")
	a := NewAgentDir(t, bins, cfg)
	a.Env = []string{"SECRET_AGENT_TOKEN=" + secret, "HTTP_PROXY=http://proxy.example:3128", "LANG=C.UTF-8"}
	a.Start()

	before := "env | sort\n" + goodBefore
	r := a.CLIWithin(60*time.Second, "deploy", "web", "--artifact", hookRelease(t, "1.0.0", before, "env | sort"), "--version", "1.0.0")
	if r.Code != 0 {
		t.Fatalf("deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	// The same hooks as root, in an app without a user.
	r = a.CLIWithin(60*time.Second, "deploy", "rootweb", "--artifact", hookRelease(t, "1.0.0", before, "env | sort"), "--version", "1.0.0")
	if r.Code != 0 {
		t.Fatalf("deploy rootweb: exit %d\n%s", r.Code, r.Stderr)
	}
	deadline := time.Now().Add(20 * time.Second)
	var st *api.Status
	for st = a.Status(); !AllReady(st, "plain", 1) || !AllReady(st, "web", 2) || !AllReady(st, "rootweb", 1); st = a.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("workers not ready within 20s: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, app := range st.Apps {
		for _, w := range app.Workers {
			env := environOf(t, w.PID)
			if strings.Contains(strings.Join(env, "\n"), secret) {
				t.Errorf("%s worker %d (pid %d) has the agent's secret in its environment:\n%s", app.Name, w.Slot, w.PID, strings.Join(env, "\n"))
			}
			want := []string{"LANG=C.UTF-8", "DEPLOYD_APP=" + app.Name}
			if app.Name == "web" {
				want = append(want, "MODE=prod", "DB_PASSWORD=from the file", "HTTP_PROXY=http://proxy.example:3128",
					"USER="+m.Name, "LOGNAME="+m.Name, "HOME=/nonexistent")
			} else if hasVar(env, "HTTP_PROXY=http://proxy.example:3128") {
				t.Errorf("%s worker %d got HTTP_PROXY, which only web's env_inherit names", app.Name, w.PID)
			}
			for _, kv := range want {
				if !hasVar(env, kv) {
					t.Errorf("%s worker %d (pid %d) lacks %s:\n%s", app.Name, w.Slot, w.PID, kv, strings.Join(env, "\n"))
				}
			}
		}
	}
	// The hooks printed their whole environment into the apps' logs.
	out, err := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	if err != nil {
		t.Fatal(err)
	}
	rootOut, err := os.ReadFile(filepath.Join(a.Dir, "logs", "rootweb.out.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), secret) || strings.Contains(string(rootOut), secret) {
		t.Errorf("a hook printed the agent's secret:\n%s\n%s", out, rootOut)
	}
	if !strings.Contains(string(rootOut), "hook before: LANG=C.UTF-8") || !strings.Contains(string(rootOut), "hook after: DEPLOYD_APP=rootweb") ||
		strings.Contains(string(rootOut), "HTTP_PROXY") {
		t.Errorf("root's hooks' environment:\n%s", rootOut)
	}
	for _, want := range []string{"hook before: DB_PASSWORD=from the file", "hook before: HTTP_PROXY=http://proxy.example:3128",
		"hook before: USER=" + m.Name, "hook after: MODE=prod", "hook after: DEPLOYD_HOOK=after"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the hooks' output lacks %q:\n%s", want, out)
		}
	}

	// An env_file any user could write is refused: the reload changes
	// nothing and says what to do.
	if err := os.Chmod(envFile, 0o606); err != nil {
		t.Fatal(err)
	}
	pids := PIDs(appOf(st, "web"))
	r = a.CLIWithin(30*time.Second, "reload")
	if r.Code == 0 || !strings.Contains(r.Stderr, "apps.web.env_file") || !strings.Contains(r.Stderr, "group- or world-writable (mode 0606)") ||
		!strings.Contains(r.Stderr, "chmod go-w "+envFile) {
		t.Errorf("reload with a world-writable env_file: exit %d, want a refusal naming the file and the fix\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := a.CLIWithin(30*time.Second, "config", "check"); r.Code != 2 || !strings.Contains(r.Stderr, "group- or world-writable") {
		t.Errorf("config check with a world-writable env_file: exit %d\n%s", r.Code, r.Stderr)
	}
	if got := PIDs(appOf(a.Status(), "web")); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("the refused reload changed web's workers: %v -> %v", pids, got)
	}
}
