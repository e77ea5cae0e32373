package handoff

import (
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// received is one datagram as Serve reported it.
type received struct {
	pid, uid int
	msg      Notify
}

// serveNotify runs s.Serve until the test ends; it fails the test if Serve does
// not return nil after Close.
func serveNotify(t *testing.T, s *NotifySocket) <-chan received {
	t.Helper()
	ch := make(chan received, 16)
	done := make(chan error, 1)
	go func() {
		done <- s.Serve(func(pid, uid int, msg Notify) { ch <- received{pid, uid, msg} })
	}()
	t.Cleanup(func() {
		s.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve after Close: %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return ch
}

func nextNotify(t *testing.T, ch <-chan received) received {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no notify message arrived")
	}
	return received{}
}

func sendNotify(t *testing.T, addr, msg string) {
	t.Helper()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
}

func TestNotifySocketFromThisProcess(t *testing.T) {
	base := filepath.Join(shortDir(t), "notify")
	s, err := ListenNotify(base, -1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Fallback() != nil || !strings.HasPrefix(s.Addr(), base+"/") {
		t.Errorf("Addr() = %q (fallback %v), want a path under %s", s.Addr(), s.Fallback(), base)
	}
	fi, err := os.Lstat(s.Addr())
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket file: %v, %v; want a socket of mode 0600", fi, err)
	}
	ch := serveNotify(t, s)
	sendNotify(t, s.Addr(), "READY=1\nSTATUS=warming up: 50%=half")
	r := nextNotify(t, ch)
	if r.pid != os.Getpid() || r.uid != os.Getuid() {
		t.Errorf("sender pid/uid = %d/%d, want %d/%d", r.pid, r.uid, os.Getpid(), os.Getuid())
	}
	want := Notify{"READY": "1", "STATUS": "warming up: 50%=half"}
	if !maps.Equal(r.msg, want) {
		t.Errorf("msg = %q, want %q", r.msg, want)
	}
}

// The kernel stamps the sender's pid when the datagram is sent, so it is
// right even after the sender has exited.
func TestNotifySocketFromChild(t *testing.T) {
	s, err := ListenNotify(shortDir(t), -1)
	if err != nil {
		t.Fatal(err)
	}
	ch := serveNotify(t, s)
	cmd := exec.Command(testBinary(t))
	cmd.Env = []string{
		helperEnv + "=notify-send", noRaceExitSleep,
		EnvNotifySocket + "=" + s.Addr(),
		"NOTIFY_MESSAGE=STOPPING=1\nSTATUS=bye",
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	r := nextNotify(t, ch)
	if r.pid != cmd.Process.Pid || r.uid != os.Getuid() {
		t.Errorf("sender pid/uid = %d/%d, want the child's %d/%d", r.pid, r.uid, cmd.Process.Pid, os.Getuid())
	}
	if want := (Notify{"STOPPING": "1", "STATUS": "bye"}); !maps.Equal(r.msg, want) {
		t.Errorf("msg = %q, want %q", r.msg, want)
	}
}

func TestNotifySocketClose(t *testing.T) {
	before := fdCount(t)
	base := shortDir(t)
	s, err := ListenNotify(base, -1)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ListenNotify(base, -1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() == other.Addr() {
		t.Errorf("two notify sockets share the address %q", s.Addr())
	}
	other.Close()
	done := make(chan error, 1)
	go func() { done <- s.Serve(func(int, int, Notify) {}) }()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after Close = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := s.Serve(func(int, int, Notify) {}); err != nil {
		t.Errorf("Serve on a closed socket = %v, want nil", err)
	}
	if after := fdCount(t); after != before {
		t.Errorf("%d descriptors before, %d after Close", before, after)
	}
	if ents, err := os.ReadDir(base); err != nil || len(ents) != 0 {
		t.Errorf("after Close the notify folder holds %v (%v), want nothing", ents, err)
	}
}

// Without a folder, or when the path would not fit in a socket address,
// the socket is abstract and Fallback says why.
func TestNotifySocketAbstractFallback(t *testing.T) {
	long := filepath.Join(shortDir(t), strings.Repeat("x", 100))
	for _, base := range []string{"", long} {
		s, err := ListenNotify(base, -1)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(s.Addr(), "@deployd/") || s.Fallback() == nil {
			t.Errorf("base %q: Addr() = %q, Fallback() = %v; want an abstract address and a reason", base, s.Addr(), s.Fallback())
		}
		ch := serveNotify(t, s)
		sendNotify(t, s.Addr(), "READY=1")
		if r := nextNotify(t, ch); r.msg["READY"] != "1" {
			t.Errorf("base %q: got %q", base, r.msg)
		}
	}
	if _, err := os.Stat(long); err == nil {
		t.Errorf("a too-long base %s was created", long)
	}
}

// An agent run by root gives the socket to the worker's user: that user
// can send, another cannot even connect.
func TestNotifySocketOwnedByWorkerUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown and to run helpers as other users")
	}
	const workerUID, otherUID = 65534, 65533
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "helper")
	data, err := os.ReadFile(testBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := ListenNotify(filepath.Join(dir, "notify"), workerUID)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(s.Addr(), &st); err != nil || st.Uid != workerUID || st.Mode&0o777 != 0o600 {
		t.Errorf("socket stat: uid %d mode %o (%v); want uid %d mode 600", st.Uid, st.Mode&0o777, err, workerUID)
	}
	// The folder stays root's: the worker's user passes through it but
	// cannot plant anything there (a symlink at "health" would have
	// the root agent chown and chmod what it points to).
	folder := filepath.Dir(s.Addr())
	if err := unix.Stat(folder, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o711 {
		t.Errorf("socket folder stat: uid %d mode %o (%v); want uid 0 mode 711", st.Uid, st.Mode&0o777, err)
	}
	ch := serveNotify(t, s)
	runAs := func(uid uint32, env ...string) error {
		cmd := exec.Command(exe)
		cmd.Env = append([]string{noRaceExitSleep}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	send := func(uid uint32) error {
		return runAs(uid, helperEnv+"=notify-send", EnvNotifySocket+"="+s.Addr(), "NOTIFY_MESSAGE=READY=1")
	}
	target := filepath.Join(dir, "target")
	if err := runAs(workerUID, helperEnv+"=symlink", "SYMLINK_TARGET="+target, "SYMLINK_AT="+filepath.Join(folder, "health")); err == nil {
		t.Errorf("the worker's user planted a symlink in its notify folder %s", folder)
	}
	if err := send(otherUID); err == nil {
		t.Errorf("uid %d could send to uid %d's notify socket", otherUID, workerUID)
	}
	if err := send(workerUID); err != nil {
		t.Fatalf("the worker's user could not send: %v", err)
	}
	if r := nextNotify(t, ch); r.uid != workerUID || r.msg["READY"] != "1" {
		t.Errorf("got uid %d %q, want uid %d READY=1", r.uid, r.msg, workerUID)
	}
}

func TestParseNotify(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Notify
	}{
		{"READY=1", Notify{"READY": "1"}},
		{"READY=1\n", Notify{"READY": "1"}},
		{"STATUS=a=b\nREADY=1", Notify{"STATUS": "a=b", "READY": "1"}},
		{"STATUS=one\nSTATUS=two", Notify{"STATUS": "two"}},
		{"=x\nno-equals\nK=", Notify{"K": ""}},
		{"", Notify{}},
		{"\n\n=", Notify{}},
	} {
		if got := ParseNotify([]byte(tc.in)); !maps.Equal(got, tc.want) {
			t.Errorf("ParseNotify(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzParseNotify compares ParseNotify with refParseNotify, a plain
// line-by-line reading of the sd_notify format written independently of it
// (a parser that drops or mangles any assignment differs from it).
func FuzzParseNotify(f *testing.F) {
	for _, s := range []string{"READY=1", "STATUS=a=b\nREADY=1", "", "\n\n=", "\x00\xff=\xfe\n=\n\x80READY",
		"MAINPID=42\nREADY=1\nSTATUS=x\nSTATUS=y\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := ParseNotify(b)
		if n == nil {
			t.Fatal("ParseNotify returned nil")
		}
		if want := refParseNotify(string(b)); !maps.Equal(n, want) {
			t.Errorf("ParseNotify(%q) = %q, want %q", b, n, want)
		}
	})
}

// refParseNotify: every line "KEY=VALUE" with a non-empty KEY sets KEY to
// VALUE (the first '=' separates them; a later line wins); other lines are
// ignored.
func refParseNotify(s string) map[string]string {
	m := map[string]string{}
	for s != "" {
		line := s
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			line, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		if i := strings.IndexByte(line, '='); i > 0 {
			m[line[:i]] = line[i+1:]
		}
	}
	return m
}

func TestIPCChannel(t *testing.T) {
	before := fdCount(t)
	ch, err := NewIPCChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Parent.Close()
	for _, f := range []*os.File{ch.Parent, ch.Child} {
		raw, err := f.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		var ferr error
		raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFD, 0) })
		if ferr != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s is not close-on-exec", f.Name())
		}
	}
	if _, err := ch.Child.Write([]byte("\"ready\"\n")); err != nil {
		t.Fatal(err)
	}
	ch.Child.Close()
	got, err := io.ReadAll(ch.Parent) // EOF: the only copy of Child is closed
	if err != nil || string(got) != "\"ready\"\n" {
		t.Errorf("Parent read %q, %v; want the line written on Child", got, err)
	}
	ch.Parent.Close()
	if after := fdCount(t); after != before {
		t.Errorf("%d descriptors before, %d after", before, after)
	}
}

// A folder whose socket no one binds any more is removed; a live one stays.
func TestRemoveStaleNotify(t *testing.T) {
	base := shortDir(t)
	live, err := ListenNotify(base, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	stale, err := ListenNotify(base, -1)
	if err != nil {
		t.Fatal(err)
	}
	staleDir := filepath.Dir(stale.Addr())
	stale.conn.Close() // as a killed agent leaves it: the file stays, nobody bound
	if _, err := os.Stat(stale.Addr()); err != nil {
		t.Fatal(err)
	}
	RemoveStaleNotify(base)
	if _, err := os.Stat(staleDir); !os.IsNotExist(err) {
		t.Errorf("stale folder %s still there (%v)", staleDir, err)
	}
	if _, err := os.Stat(live.Addr()); err != nil {
		t.Errorf("the live socket was removed: %v", err)
	}
}

// A worker adopted from an older agent, which gave the notify folder to
// the worker's user: the folder becomes the agent's again (when root),
// and a symlink planted as its health socket is not taken for one (the
// agent would probe the socket it points to).
func TestAdoptedNotifyFolderReclaimed(t *testing.T) {
	const workerUID = 65534
	dir := shortDir(t)
	folder := filepath.Join(dir, "notify", "0123abcd")
	if err := os.MkdirAll(folder, 0o700); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	if root {
		if err := os.Chown(folder, workerUID, -1); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(folder, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other, err := net.Listen("unix", filepath.Join(dir, "other.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := os.Symlink(filepath.Join(dir, "other.sock"), filepath.Join(folder, "health")); err != nil {
		t.Fatal(err)
	}
	f, err := conn.File()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NotifyFromFile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if addr := HealthAddr(s.Addr()); HealthPresent(addr) {
		t.Errorf("HealthPresent(%s) = true for a symlink to another socket", addr)
	}
	if !root {
		return
	}
	var st unix.Stat_t
	if err := unix.Stat(folder, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o711 {
		t.Errorf("adopted notify folder: uid %d mode %o (%v); want uid 0 mode 711", st.Uid, st.Mode&0o777, err)
	}
}
