package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// What an app's code asks to listen on is input: a Node.js app without a
// listen list, running as its own user from code that user owns, gets
// only what the config allows. The app's user steers the code through a
// file in the app's folder (target: JSON {"port": N} or {"path": P}, and
// "notify": a line its child sends over NOTIFY_SOCKET first).
const askingApp = `const fs = require('fs');
const t = JSON.parse(fs.readFileSync(__dirname + '/target', 'utf8'));
if (t.notify) require('child_process').spawnSync('systemd-notify', [t.notify], { stdio: 'inherit' });
const srv = require('http').createServer((q, r) => r.end('version=asking\n'));
if (t.path) srv.listen(t.path); else srv.listen(t.port, '127.0.0.1');
`

// askingAppDir writes the asking app into a folder m owns, aimed at target.
func askingAppDir(t *testing.T, m *member, target string) string {
	t.Helper()
	dir := m.Dir(t)
	if err := os.WriteFile(filepath.Join(dir, "app.js"), []byte(askingApp), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Own(t, dir) // the code is the app user's
	aim(t, m, dir, target)
	return dir
}

// aim is the app's user changing what its code asks for.
func aim(t *testing.T, m *member, dir, target string) {
	t.Helper()
	p := filepath.Join(dir, "target")
	if err := os.WriteFile(p, []byte(target), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Own(t, p)
}

// trustConfig is a victim (the test app on vport, 2 workers) and the
// asking app run by user from dir, with no listen list.
func trustConfig(t *testing.T, dir, user string, vport int, extra string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	return appConfig("victim", vport, 2, `env = { TESTAPP_VERSION = "victim" }`) + fmt.Sprintf(`
[apps.asking]
command = [%q, "app.js"]
cwd = %q
user = %q
instances = 2
ready_timeout = "20s"
stop_timeout = "5s"
%s
`, node, dir, user, extra)
}

// startTrust starts the agent on both apps aimed at a free port of the
// asking app's own, and returns it with that port and state.json.
func startTrust(t *testing.T, m *member, vport int, extra string) (a *Agent, dir string, own int, state []byte) {
	t.Helper()
	own = FreePort(t)
	dir = askingAppDir(t, m, fmt.Sprintf(`{"port": %d}`, own))
	a = StartAgent(t, bins, trustConfig(t, dir, m.Name, vport, extra))
	a.WaitFor("both apps ready", time.Minute, func(st *api.Status) bool {
		return AllReady(st, "victim", 2) && AllReady(st, "asking", 2)
	})
	state, err := os.ReadFile(filepath.Join(a.Dir, "state", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	return a, dir, own, state
}

// refusedCleanly checks a reload of asking that must be refused with
// words, and that it changed nothing: state.json as it was, the old
// workers answering on own.
func refusedCleanly(t *testing.T, a *Agent, own int, state []byte, words ...string) {
	t.Helper()
	before := PIDs(a.App("asking"))
	r := a.CLIWithin(2*time.Minute, "reload", "asking")
	t.Logf("deployd reload asking: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	if r.Code == 0 {
		t.Errorf("the reload was not refused")
	}
	for _, w := range append(words, "refused (nothing was bound)", "nothing was changed") {
		if !strings.Contains(r.Stderr, w) {
			t.Errorf("the refusal lacks %q", w)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(a.Dir, "state", "state.json")); !bytes.Equal(now, state) {
		t.Errorf("state.json changed:\nbefore %s\nafter  %s", state, now)
	}
	if after := PIDs(a.App("asking")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the old workers must serve on: before %v, after %v", before, after)
	}
	if body, err := get(t, own, "/"); err != nil || body != "version=asking\n" {
		t.Errorf("the asking app's own port: %q, %v", body, err)
	}
}

// The app's code listens on another app's address: the reload is refused,
// naming the address, the app that has it and the fix, and every request
// to the victim's port is answered by the victim.
func TestDiscoveryCannotTakeAnotherAppsAddress(t *testing.T) {
	parallel(t)
	m := newMember(t)
	vport := FreePort(t)
	a, dir, own, state := startTrust(t, m, vport, "")
	aim(t, m, dir, fmt.Sprintf(`{"port": %d}`, vport))
	refusedCleanly(t, a, own, state, fmt.Sprintf("tcp://127.0.0.1:%d", vport), "which app victim has in the config",
		`give [apps.asking] its own listen = ["tcp://0.0.0.0:PORT"]`)
	victimAnswers(t, vport)
}

// victimAnswers sends 20 requests, each on a new connection, to the
// victim's port, and wants every one answered by the victim.
func victimAnswers(t *testing.T, vport int) {
	t.Helper()
	const n = 20
	others := 0
	for range n {
		if body, err := get(t, vport, "/"); err != nil || !strings.HasPrefix(body, "version=victim ") {
			others++
			t.Logf("not the victim: %q, %v", body, err)
		}
	}
	if others > 0 {
		t.Errorf("%d of %d requests to the victim's port were not answered by the victim", others, n)
	}
}

// listen(port) below 1024 makes root bind nothing for the app's user; root
// may allow the port with allow_ports, and then it is served.
func TestDiscoveryBindsNoPrivilegedPortUnlessAllowed(t *testing.T) {
	parallel(t)
	m := newMember(t)
	priv := freePrivilegedPort(t)
	vport := FreePort(t)
	a, dir, own, state := startTrust(t, m, vport, "")
	aim(t, m, dir, fmt.Sprintf(`{"port": %d}`, priv))
	refusedCleanly(t, a, own, state, fmt.Sprintf("tcp://127.0.0.1:%d", priv), "a privileged port",
		fmt.Sprintf(`allow_ports = ["%d"]`, priv))
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", priv)); err != nil {
		t.Fatalf("port %d is held after the refusal: %v", priv, err)
	} else {
		ln.Close()
	}

	a.WriteConfig(trustConfig(t, dir, m.Name, vport, fmt.Sprintf(`allow_ports = ["%d"]`, priv)))
	mustRun(t, a.CLIWithin(2*time.Minute, "reload", "asking"), "reload with the port allowed")
	if body, err := get(t, priv, "/"); err != nil || body != "version=asking\n" {
		t.Errorf("the allowed privileged port: %q, %v", body, err)
	}
}

// freePrivilegedPort is a port below 1024 nothing listens on.
func freePrivilegedPort(t *testing.T) int {
	t.Helper()
	for p := 980; p > 900; p-- {
		if ln, err := net.Listen("tcp", ":"+strconv.Itoa(p)); err == nil {
			ln.Close()
			return p
		}
	}
	t.Skip("no free port from 901 to 980")
	return 0
}

// listen(path) makes root create no socket file where the app's user
// chose: the preload leaves a unix socket the config does not name to the
// app (it binds it as its own user, as tsx's IPC pipe), nothing is served
// from it, and the reload is refused naming the socket and the fix.
func TestDiscoveryMakesNoSocketAtAUsersPath(t *testing.T) {
	parallel(t)
	m := newMember(t)
	a, dir, own, state := startTrust(t, m, FreePort(t), "")
	path := filepath.Join(m.Dir(t), "app.sock")
	aim(t, m, dir, fmt.Sprintf(`{"path": %q}`, path))
	before := PIDs(a.App("asking"))
	r := a.CLIWithin(2*time.Minute, "reload", "asking")
	t.Logf("deployd reload asking: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	if r.Code == 0 {
		t.Errorf("the reload was not refused")
	}
	for _, w := range []string{"left listen(" + path + ") to the app", `root adds listen = ["unix://PATH"]`, "nothing was changed"} {
		if !strings.Contains(r.Stderr, w) {
			t.Errorf("the refusal lacks %q", w)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(a.Dir, "state", "state.json")); !bytes.Equal(now, state) {
		t.Errorf("state.json changed:\nbefore %s\nafter  %s", state, now)
	}
	if after := PIDs(a.App("asking")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the old workers must serve on: before %v, after %v", before, after)
	}
	if body, err := get(t, own, "/"); err != nil || body != "version=asking\n" {
		t.Errorf("the asking app's own port: %q, %v", body, err)
	}
	// Whatever is at the path, the app's user made it: root made nothing.
	if fi, err := os.Lstat(path); err == nil {
		if st := fi.Sys().(*syscall.Stat_t); st.Uid == 0 {
			t.Errorf("root made %s (%s)", path, fi.Mode())
		}
	}
	for _, l := range a.Status().Apps {
		for _, u := range l.Listen {
			if strings.Contains(u, path) {
				t.Errorf("app %s serves the user's path: %v", l.Name, l.Listen)
			}
		}
	}
}

// A unix listener in a folder that became the app user's while the agent
// runs (a chown by mistake: the config check refuses such a folder up
// front, TestUnixListenerInSwappedFolderRefused): after the user swapped
// the folder for a link into a root-only folder, closing the listener no
// app uses removes nothing through the link. What the link leads to is a
// root socket of the same name (another service's): the agent removes
// only sockets, so only the folder opened without links keeps that one (a
// regular file there would be left by the socket check alone).
func TestClosingAUnixListenerNeverFollowsALink(t *testing.T) {
	parallel(t)
	m := newMember(t)
	parent := rootFolder(t, "deployd-listen-")
	run := filepath.Join(parent, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(run, "app.sock")
	cfg := fmt.Sprintf("[apps.web]\ncommand = [\"%%TESTAPP%%\"]\ninstances = 1\nlisten = [\"unix://%s\"]\nuser = %q\n", sock, m.Name)
	a := StartAgent(t, bins, cfg)
	a.WaitFor("ready", time.Minute, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the socket at %s: %v", sock, err)
	}
	secret := filepath.Join(rootOnlyDir(t, 0o700), "app.sock")
	other, err := net.Listen("unix", secret)
	if err != nil {
		t.Fatal(err)
	}
	other.(*net.UnixListener).SetUnlinkOnClose(false)
	defer other.Close()
	// The folders become the app user's, who swaps the socket's for a link.
	m.Own(t, parent)
	asMember(t, m, fmt.Sprintf("mv %s %s.old && ln -s %s %s", run, run, filepath.Dir(secret), run))
	// Root moves the app to a TCP port: the unix listener loses its last lease.
	a.WriteConfig(appConfig("web", FreePort(t), 1, fmt.Sprintf("user = %q", m.Name)))
	mustRun(t, a.CLIWithin(2*time.Minute, "reload", "web"), "reload to a tcp listener")
	a.WaitFor("the listener closed", 10*time.Second, func(*api.Status) bool {
		return strings.Contains(a.Log(), "closing listener no app uses")
	})
	if fi, err := os.Lstat(secret); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the root socket behind the link: %v, %v", fi, err)
	}
	if !strings.Contains(a.Log(), "socket file left in place") {
		t.Errorf("the agent log does not say the socket file was left in place:\n%s", a.Log())
	}
}

// A LISTEN= sent over NOTIFY_SOCKET (here by a child of the app, claiming
// the victim's port) is not a report: the agent takes the address from the
// preload's own channel, the port the app's code listens on.
func TestDiscoveryIgnoresListenOverNotifySocket(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("systemd-notify"); err != nil {
		t.Skip("needs systemd-notify to send LISTEN= over NOTIFY_SOCKET")
	}
	m := newMember(t)
	vport := FreePort(t)
	a, dir, _, _ := startTrust(t, m, vport, "")
	next := FreePort(t)
	aim(t, m, dir, fmt.Sprintf(`{"port": %d, "notify": "LISTEN=tcp://127.0.0.1:%d"}`, next, vport))
	mustRun(t, a.CLIWithin(2*time.Minute, "reload", "asking"), "reload of the app that sends LISTEN= over NOTIFY_SOCKET")
	want := fmt.Sprintf("tcp://127.0.0.1:%d (discovered)", next)
	if got := a.App("asking").Listen; len(got) != 1 || got[0] != want {
		t.Errorf("status listen = %q, want [%q]", got, want)
	}
	if !strings.Contains(a.Log(), "ignored LISTEN= on NOTIFY_SOCKET") {
		t.Errorf("the agent log does not say it ignored the LISTEN=:\n%s", a.Log())
	}
	victimAnswers(t, vport)
}
