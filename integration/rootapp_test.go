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

// A member's deploy, reload or restart of an app that runs as root (no
// user, root agent) is refused with a message naming the key that allows
// it, and nothing runs; `config check` warns. Before, the deploy ran the
// member's release as root and `config check` said ok.
func TestMemberRefusedOnRootApp(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	a := startMemberAgent(t, m, "", releasesApp(port, 1))
	dir := m.Dir(t)
	v1 := filepath.Join(dir, "release-v1")
	if err := os.Rename(artifactDir(t, "v1", false), v1); err != nil {
		t.Fatal(err)
	}
	m.Own(t, dir)
	const d = 30 * time.Second
	for _, args := range [][]string{
		{"deploy", "web", "--artifact", v1, "--version", "v1"},
		{"reload", "web"},
		{"reload"},
		{"restart", "web"},
		{"scale", "web", "2"},
	} {
		r := cliAsBounded(t, a, m.Cred, d, args...)
		if r.Code != 1 || !strings.Contains(r.Stderr, "runs as root") || !strings.Contains(r.Stderr, "members_may_run_as_root = true") {
			t.Errorf("member's %v: exit %d, want 1 naming members_may_run_as_root:\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "state", "releases", "web", "v1")); err == nil {
		t.Error("the refused deploy installed its release")
	}
	if r := cliAsBounded(t, a, m.Cred, d, "status"); r.Code != 0 {
		t.Errorf("member's status: exit %d\n%s", r.Code, r.Stderr)
	}
	r := cliAsBounded(t, a, nil, d, "config", "check", "-c", a.Config)
	if r.Code != 0 || !strings.Contains(r.Stderr, "warning: ") || !strings.Contains(r.Stderr, "apps.web.user: the app runs as root") ||
		!strings.Contains(r.Stderr, "members_may_run_as_root = true") {
		t.Errorf("config check: exit %d, want 0 with a warning naming members_may_run_as_root:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	// Root's deploy works; with the key, so does the member's.
	if r := cliAsBounded(t, a, nil, d, "deploy", "web", "--artifact", v1, "--version", "v1"); r.Code != 0 {
		t.Fatalf("root's deploy: exit %d\n%s", r.Code, r.Stderr)
	}
	a.WriteConfig(fmt.Sprintf("socket_group = %q\n\n%s", m.Group, releasesApp(port, 1)+memberRootKey))
	if r := cliAsBounded(t, a, nil, d, "reload", "web"); r.Code != 0 {
		t.Fatalf("root's reload: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := cliAsBounded(t, a, m.Cred, d, "restart", "web"); r.Code != 0 {
		t.Errorf("member's restart with members_may_run_as_root: exit %d\n%s", r.Code, r.Stderr)
	}
	waitStatus(t, a, "web ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
}
