package integration

// The privilege model (agent/control/privileges.go, SECURITY.md): the agent runs as
// root with socket_group; a member of that group controls apps but never
// gets root. These tests create the user and the group, so they run as
// root (CI does) and skip otherwise.

import (
	"archive/tar"
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

// evilCandidate is a "new agent binary" a member wrote: it records who ran
// it in marker, then poses as deployd.
func evilCandidate(t *testing.T, m *member, dir, marker string) string {
	t.Helper()
	p := filepath.Join(dir, "evil")
	body := fmt.Sprintf("#!/bin/sh\nid > %s\n[ \"$1\" = version ] && { echo \"deployd evil-1\"; exit 0; }\nexec sleep 600\n", marker)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	m.Own(t, p)
	return p
}

// startMemberAgent starts an agent (as root, from its own binary copy) with
// socket_group = m's group and the extra [agent] settings.
func startMemberAgent(t *testing.T, m *member, agentExtra, apps string) *Agent {
	t.Helper()
	a := NewAgentDir(t, bins, fmt.Sprintf("socket_group = %q\n%s\n%s", m.Group, agentExtra, apps))
	a.UseOwnBinary()
	a.Start()
	return a
}

func TestMemberUnsignedUpgradeNeverRuns(t *testing.T) {
	parallel(t)
	m := newMember(t)
	_, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	for _, tc := range []struct {
		name, agentExtra string
		sign             bool // sign with a key the agent does not trust
		want             string
	}{
		{"no upgrade_public_key", "", false, "no [agent] upgrade_public_key"},
		{"key set, no signature", fmt.Sprintf("upgrade_public_key = %q", trustedKey(t)), false, "signature is required"},
		{"key set, other key's signature", fmt.Sprintf("upgrade_public_key = %q", trustedKey(t)), true, "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startMemberAgent(t, m, tc.agentExtra, versionedApp(port, 1, "v1", "", ""))
			a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
			pid0, _ := agentPID(t, a)
			orig := mustRead(t, a.Binary)
			dir := m.Dir(t)
			marker := filepath.Join(dir, "ran-as")
			evil := evilCandidate(t, m, dir, marker)
			args := []string{"upgrade", "--binary", evil, "--sha256", fmt.Sprintf("%x", sha256.Sum256(mustRead(t, evil)))}
			if tc.sign {
				sig := filepath.Join(dir, "evil.minisig")
				os.WriteFile(sig, minisign.Sign(priv, mustRead(t, evil)), 0o644)
				args = append(args, "--signature", sig)
			}
			r := a.CLIAs(m.Cred, args...)
			if r.Code != 1 || !strings.Contains(r.Stderr, tc.want) || !strings.Contains(r.Stderr, "nothing changed") {
				t.Errorf("member's upgrade: exit %d, want 1 with %q:\n%s", r.Code, tc.want, r.Stderr)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Errorf("the candidate ran: it wrote %q", b)
			}
			if pid, _ := agentPID(t, a); pid != pid0 {
				t.Errorf("agent pid %d, want the old %d", pid, pid0)
			}
			if !bytes.Equal(mustRead(t, a.Binary), orig) {
				t.Error("the agent's binary changed")
			}
			if _, err := os.Stat(filepath.Join(a.Dir, ".deployd.new")); err == nil {
				t.Error("a refused candidate was left beside the agent's binary")
			}
			if !strings.Contains(a.Log(), fmt.Sprintf("uid=%d", m.UID)) {
				t.Errorf("the agent log does not name the caller uid %d:\n%s", m.UID, a.Log())
			}
		})
	}
}

// trustedKeys are generated once per test binary: trustedKey's public half,
// trustedPriv signs.
var trustedPub, trustedPriv = func() (string, minisign.PrivateKey) {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	text, _ := pub.MarshalText()
	return string(text), priv
}()

func trustedKey(*testing.T) string { return trustedPub }

func TestMemberSignedUpgradeWorks(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	a := startMemberAgent(t, m, fmt.Sprintf("upgrade_public_key = %q\nupgrade_timeout = \"20s\"", trustedKey(t)),
		versionedApp(port, 1, "v1", "", ""))
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	dir := m.Dir(t)
	v2 := filepath.Join(dir, "deployd-v2")
	CopyFile(t, bins.DeploydV2, v2)
	sig := v2 + ".minisig"
	os.WriteFile(sig, minisign.Sign(trustedPriv, mustRead(t, v2)), 0o644)
	m.Own(t, dir)
	// A member may not re-execute the current binary, nor shut down.
	if r := a.CLIAs(m.Cred, "upgrade"); r.Code != 1 || !strings.Contains(r.Stderr, "signed") {
		t.Errorf("member's upgrade without a binary: exit %d\n%s", r.Code, r.Stderr)
	}
	r := a.CLIAs(m.Cred, "upgrade", "--binary", v2, "--signature", sig, "--json")
	if r.Code != 0 {
		t.Fatalf("member's signed upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	if _, v := agentPID(t, a); v != "test-2" {
		t.Errorf("after the member's signed upgrade the agent is %s", v)
	}
	if !bytes.Equal(mustRead(t, a.Binary), mustRead(t, bins.DeploydV2)) {
		t.Error("the agent's binary is not the signed one")
	}
	a.WaitFor("workers of the new agent ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	if _, err := get(t, port, "/"); err != nil {
		t.Errorf("the app does not serve after the upgrade: %v", err)
	}
}

func TestMemberDeployOfUnreadableArtifactWritesNothing(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	a := startMemberAgent(t, m, "", releasesApp(port, 1)+memberRootKey)
	stateDir := filepath.Join(a.Dir, "state")
	readableDir := rootOnlyDir(t, 0o755) // the folder is readable; its secret is not
	tgz := filepath.Join(filepath.Dir(readableDir), "secret.tar.gz")
	if err := os.WriteFile(tgz, mustRead(t, releaseTarball(t, "stolen")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		artifact string
	}{
		{"folder only root can read", rootOnlyDir(t, 0o700)},
		{"a file inside only root can read", readableDir},
		{"tarball only root can read", tgz},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tree(t, stateDir)
			r := a.CLIAs(m.Cred, "deploy", "web", "--artifact", tc.artifact, "--version", "v1")
			if r.Code != 2 || !strings.Contains(r.Stderr, "permission denied") {
				t.Errorf("member's deploy of %s: exit %d, want 2 with permission denied:\n%s", tc.artifact, r.Code, r.Stderr)
			}
			if after := tree(t, stateDir); after != before {
				t.Errorf("state_dir changed after a refused deploy:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	// The agent reads a readable artifact and refuses it: the staged copy goes.
	t.Run("checksum mismatch", func(t *testing.T) {
		own := m.Dir(t)
		art := filepath.Join(own, "web.tar.gz")
		os.WriteFile(art, mustRead(t, releaseTarball(t, "v9")), 0o644)
		m.Own(t, art)
		before := tree(t, stateDir)
		r := a.CLIAs(m.Cred, "deploy", "web", "--artifact", art, "--version", "v9", "--sha256", strings.Repeat("ab", 32))
		if r.Code != 2 || !strings.Contains(r.Stderr, "sha256 mismatch") {
			t.Errorf("exit %d, want 2 with sha256 mismatch:\n%s", r.Code, r.Stderr)
		}
		if after := tree(t, stateDir); after != before {
			t.Errorf("state_dir changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
	// An older client naming the path is refused before the agent opens it.
	t.Run("path in the request", func(t *testing.T) {
		before := tree(t, stateDir)
		out := rawAs(t, m.Cred, a.Socket, api.PathDeploy,
			fmt.Sprintf(`{"app":"web","artifact":%q,"version":"v1"}`, rootOnlyDir(t, 0o700)))
		if !strings.Contains(out, "permission denied") || !strings.Contains(out, "CLI") {
			t.Errorf("member's deploy naming a path: %s", out)
		}
		if after := tree(t, stateDir); after != before {
			t.Errorf("state_dir changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		out = rawAs(t, m.Cred, a.Socket, api.PathUpgrade, `{"binary":"/bin/sh"}`)
		if !strings.Contains(out, "permission denied") {
			t.Errorf("member's upgrade naming a path: %s", out)
		}
	})
	if rel := a.App("web").Release; rel != "" {
		t.Errorf("release %q after refused deploys", rel)
	}
	// Root may still name a path, as before.
	out := rawAs(t, nil, a.Socket, api.PathDeploy, fmt.Sprintf(`{"app":"web","artifact":%q,"version":"v1"}`, rootOnlyDir(t, 0o700)))
	if !strings.Contains(out, `"status":"deployed"`) {
		t.Errorf("root's deploy naming a path: %s", out)
	}
}

func TestMemberDeploysOwnArtifactAndRunsApps(t *testing.T) {
	parallel(t)
	m := newMember(t)
	port := FreePort(t)
	a := startMemberAgent(t, m, "", releasesApp(port, 1)+memberRootKey)
	dir := m.Dir(t)
	v1 := filepath.Join(dir, "release-v1")
	os.Rename(artifactDir(t, "v1", false), v1)
	v2 := filepath.Join(dir, "web-v2.tar.gz")
	os.Rename(releaseTarball(t, "v2"), v2)
	m.Own(t, dir)
	for _, step := range []struct {
		args    []string
		version string // served after the step; "" = not checked
	}{
		{[]string{"deploy", "web", "--artifact", v1, "--version", "v1"}, "v1"},
		{[]string{"deploy", "web", "--artifact", v2, "--version", "v2"}, "v2"},
		{[]string{"status"}, ""},
		{[]string{"releases", "web"}, ""},
		{[]string{"reload", "web"}, "v2"},
		{[]string{"restart", "web"}, "v2"},
		{[]string{"scale", "web", "2"}, "v2"},
		{[]string{"stop", "web"}, ""},
		{[]string{"start", "web"}, "v2"},
		{[]string{"rollback", "web"}, "v1"},
		{[]string{"logs", "web", "-n", "1"}, ""},
	} {
		r := a.CLIAs(m.Cred, step.args...)
		if r.Code != 0 {
			t.Fatalf("member's %v: exit %d\n%s\n%s", step.args, r.Code, r.Stderr, a.Log())
		}
		if step.version != "" {
			requireVersion(t, a, port, step.version)
		}
	}
	// Files the member deployed are in the release, owned as installed.
	if _, err := os.Stat(filepath.Join(a.Dir, "state", "releases", "web", "v1", "run")); err != nil {
		t.Errorf("release v1: %v", err)
	}
	requireMemberLimits(t, a, m)
}

// requireMemberLimits: supplementary members are members, a member cannot
// shut the agent down, and the log names the member's calls.
func requireMemberLimits(t *testing.T, a *Agent, m *member) {
	t.Helper()
	// A user in socket_group only as a supplementary group is a member too
	// (SO_PEERGROUPS), with the same limits.
	supp := &syscall.Credential{Uid: m.Cred.Uid, Gid: 65534, Groups: []uint32{uint32(m.GID)}}
	if r := a.CLIAs(supp, "status"); r.Code != 0 {
		t.Errorf("supplementary member's status: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLIAs(supp, "shutdown"); r.Code != 1 || !strings.Contains(r.Stderr, "root and the agent's uid") {
		t.Errorf("supplementary member's shutdown: exit %d\n%s", r.Code, r.Stderr)
	}
	r := a.CLIAs(m.Cred, "shutdown")
	if r.Code != 1 || !strings.Contains(r.Stderr, "root and the agent's uid") {
		t.Errorf("member's shutdown: exit %d\n%s", r.Code, r.Stderr)
	}
	ctx, cancel := a.Ctx(0)
	defer cancel()
	if _, err := a.Client.Version(ctx); err != nil {
		t.Errorf("the agent stopped after a member's refused shutdown: %v", err)
	}
	for _, call := range []string{"POST /v1/deploy", "POST /v1/rollback", "POST /v1/shutdown"} {
		if !strings.Contains(a.Log(), fmt.Sprintf("call=%q", call)) {
			t.Errorf("the agent log has no %s request", call)
		}
	}
	if !strings.Contains(a.Log(), fmt.Sprintf("uid=%d", m.UID)) {
		t.Errorf("the agent log does not name uid %d", m.UID)
	}
}

// memberRootKey lets members operate the app although it runs as root (no
// user): these tests are about what a member can and cannot reach.
const memberRootKey = "members_may_run_as_root = true\n"

// releaseTarball is a .tar.gz release: ./run starting the test app.
func releaseTarball(t *testing.T, version string) string {
	t.Helper()
	server := string(mustRead(t, bins.TestApp))
	run := fmt.Sprintf("#!/bin/sh\nexec ./server -version %s\n", version)
	return tarball(t, []*tar.Header{
		{Name: "server", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "run", Typeflag: tar.TypeReg, Mode: 0o755},
	}, map[string]string{"server": server, "run": run})
}
