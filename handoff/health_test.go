package handoff

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHealthAddr(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/deployd/run/notify/0123abcd/notify": "/var/lib/deployd/run/notify/0123abcd/health",
		"@deployd/42/0123abcd/notify":                 "@deployd/42/0123abcd/health",
	} {
		if got := HealthAddr(in); got != want {
			t.Errorf("HealthAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// The health listener is the fd after the listeners, counted in LISTEN_FDS
// and named deployd-health; extra files follow it. The socket is 0600 and
// accepts connections at its path after the agent closed its copy.
func TestStartPassesHealthListener(t *testing.T) {
	exe := testBinary(t)
	tcp := mustOpen(t, "tcp", "127.0.0.1:0", true)
	tcpAddr, err := tcp.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	addr := filepath.Join(shortDir(t), "health")
	hf, err := ListenHealth(addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(addr); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("health socket %s: %v, %v; want a 0600 socket", addr, fi.Mode(), err)
	}
	if !HealthPresent(addr) || HealthPresent(addr+"-none") {
		t.Errorf("HealthPresent: %v for the socket, %v for no socket; want true, false", HealthPresent(addr), HealthPresent(addr+"-none"))
	}
	ipc, err := NewIPCChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ipc.Parent.Close()
	res := runProc(t, Proc{
		Shim: exe, Argv: []string{exe},
		Env:       []string{helperEnv + "=print-env", noRaceExitSleep, "WRITE_EXTRA=1"},
		Listeners: []Bound{{Listener: tcp, Name: "http"}},
		Health:    hf,
		Extra:     []*os.File{ipc.Child},
	})
	ipc.Child.Close()
	hf.Close()
	if res.exitCode != 0 {
		t.Fatalf("helper exited %d; stderr:\n%s", res.exitCode, res.stderr)
	}
	var rep childReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("helper output %q: %v", res.stdout, err)
	}
	if rep.ListenFDs != "2" || rep.ListenFDNames != "http:"+HealthFDName {
		t.Errorf("LISTEN_FDS=%q LISTEN_FDNAMES=%q, want 2 and http:%s", rep.ListenFDs, rep.ListenFDNames, HealthFDName)
	}
	if want := []string{tcpAddr, addr}; !slices.Equal(rep.Socknames, want) {
		t.Errorf("getsockname of fds 3, 4 = %q, want %q", rep.Socknames, want)
	}
	if got, err := io.ReadAll(ipc.Parent); !rep.ExtraWritten || err != nil || string(got) != "extra\n" {
		t.Errorf("the extra file is not fd 5, after the health listener: written %v (%s), read %q, %v",
			rep.ExtraWritten, rep.ExtraErr, got, err)
	}
}

// An abstract health socket listens under its name.
func TestListenHealthAbstract(t *testing.T) {
	addr := "@deployd-test/" + filepath.Base(shortDir(t)) + "/health"
	hf, err := ListenHealth(addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c.Close()
	if !HealthPresent(addr) {
		t.Errorf("HealthPresent(%q) = false, want true", addr)
	}
}

// A symlink swapped in for the health socket between its bind and its
// chown (by a user who could write the folder) is refused, and what it
// points to keeps its owner and mode: the root agent neither chowns nor
// chmods through it.
func TestListenHealthFollowsNoSymlink(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("root's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	uid := -1
	if os.Geteuid() == 0 {
		uid = 65534
	}
	addr := filepath.Join(dir, "health")
	plant := func() {
		if err := os.Remove(addr); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(target, addr); err != nil {
			t.Error(err)
		}
	}
	hf, err := listenHealth(addr, uid, plant)
	if err == nil {
		hf.Close()
		t.Errorf("listenHealth with a symlink planted at %s succeeded; want an error", addr)
	} else if !strings.Contains(err.Error(), "replaced") {
		t.Errorf("error %q does not say the socket was replaced", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil || st.Uid != uint32(os.Geteuid()) || st.Mode&0o777 != 0o644 {
		t.Errorf("the symlink's target: uid %d mode %o (%v); want uid %d mode 644, untouched",
			st.Uid, st.Mode&0o777, err, os.Geteuid())
	}
	if _, err := os.Lstat(addr); !os.IsNotExist(err) {
		t.Errorf("%s is left behind after the refusal (%v)", addr, err)
	}
}
