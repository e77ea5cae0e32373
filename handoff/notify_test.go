package handoff

import (
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"strings"
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
	s, err := ListenNotify()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Addr(), "@deployd/") {
		t.Errorf("Addr() = %q, want an abstract @deployd/... address", s.Addr())
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
	s, err := ListenNotify()
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
	s, err := ListenNotify()
	if err != nil {
		t.Fatal(err)
	}
	other, err := ListenNotify()
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
