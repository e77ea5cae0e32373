package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// TestReleaseUpgradeVerifiesSignature upgrades a running agent to the
// deployd binary of a release made by GoReleaser (.goreleaser.yaml), with
// the minisign signature the release ships beside it: what a user does with
// a downloaded release. .ci/run makes a snapshot release signed with a
// throwaway key and names it in DEPLOYD_RELEASE_DIST (GoReleaser's dist
// folder) and DEPLOYD_RELEASE_PUBKEY (the key's .pub file).
func TestReleaseUpgradeVerifiesSignature(t *testing.T) {
	dist, pubFile := os.Getenv("DEPLOYD_RELEASE_DIST"), os.Getenv("DEPLOYD_RELEASE_PUBKEY")
	if dist == "" || pubFile == "" {
		skipOrFail(t, "DEPLOYD_RELEASE_DIST and DEPLOYD_RELEASE_PUBKEY are not set: .ci/run sets them "+
			"to the snapshot release it makes with goreleaser and its throwaway minisign key")
	}
	var meta struct{ Version string }
	if err := json.Unmarshal(mustRead(t, filepath.Join(dist, "metadata.json")), &meta); err != nil || meta.Version == "" {
		t.Fatalf("%s/metadata.json: %v (version %q)", dist, err, meta.Version)
	}
	found, _ := filepath.Glob(filepath.Join(dist, "deployd_linux_"+runtime.GOARCH+"*", "deployd"))
	if len(found) != 1 {
		t.Fatalf("want one deployd binary for linux/%s in %s, found %v", runtime.GOARCH, dist, found)
	}
	rel, sig := found[0], found[0]+".minisig"
	pubLines := strings.Fields(strings.TrimSpace(string(mustRead(t, pubFile))))
	pub := pubLines[len(pubLines)-1] // the key line, after the comment

	port := FreePort(t)
	a := NewAgentDir(t, bins, "")
	head := fmt.Sprintf("[agent]\nsocket = %q\nstate_dir = \"state\"\nlog_dir = \"logs\"\nupgrade_timeout = \"20s\"\nupgrade_public_key = %q\n\n",
		a.Socket, pub)
	app := strings.ReplaceAll(versionedApp(port, 1, "v1", "", ""), "%TESTAPP%", a.bins.TestApp)
	if err := os.WriteFile(a.Config, []byte(head+app), 0o644); err != nil {
		t.Fatal(err)
	}
	a.UseOwnBinary()
	a.Start()
	a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	pid0, _ := agentPID(t, a)
	workers := workerPIDs(a.Status())

	// The same signature over a binary one byte longer is refused.
	tampered := filepath.Join(t.TempDir(), "deployd")
	if err := os.WriteFile(tampered, append(mustRead(t, rel), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := a.CLI("upgrade", "--binary", tampered, "--signature", sig); r.Code != 1 || !strings.Contains(r.Stderr, "does not verify") {
		t.Fatalf("tampered binary: exit %d, want 1 and \"does not verify\":\n%s", r.Code, r.Stderr)
	}

	if r := a.CLI("upgrade", "--binary", rel, "--signature", sig); r.Code != 0 {
		t.Fatalf("upgrade to the release binary: exit %d\n%s\n%s\n%s", r.Code, r.Stdout, r.Stderr, a.Log())
	}
	pid1, v := agentPID(t, a)
	if want := "v" + meta.Version; v != want || pid1 == pid0 {
		t.Errorf("after the upgrade: agent pid %d version %q, want a new pid (not %d) and %q", pid1, v, pid0, want)
	}
	if !bytes.Equal(mustRead(t, a.Binary), mustRead(t, rel)) {
		t.Errorf("the agent's binary is not the release's")
	}
	if after := workerPIDs(a.Status()); fmt.Sprint(after) != fmt.Sprint(workers) {
		t.Errorf("workers changed across the agent upgrade: %v -> %v", workers, after)
	}
	if _, err := get(t, port, "/"); err != nil {
		t.Errorf("not serving after the upgrade: %v", err)
	}
}
