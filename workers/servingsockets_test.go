package workers

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
)

// reusePortListen listens on addr with SO_REUSEPORT, as the workers of a
// steering group do, and returns the listener, its file and inode.
func reusePortListen(t *testing.T, addr string) (net.Listener, uint64) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return l, st.Ino
}

// TestServingInodesCountTheAddressesGroup: for a shared listener, the
// sockets an old worker may still take connections through are the
// listener's and every other socket listening on its address (a dead
// agent's steering group, whose survivors each hold their own), not a
// socket on another port.
func TestServingInodesCountTheAddressesGroup(t *testing.T) {
	first, ino1 := reusePortListen(t, "127.0.0.1:0")
	addr := first.Addr().String()
	_, ino2 := reusePortListen(t, addr)
	_, other := reusePortListen(t, "127.0.0.1:0")
	f, err := first.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	l := handoff.Adopt(f, "tcp", addr) // shared: no steering
	defer l.Close()
	got := servingInodes(&Spec{Listeners: []handoff.Bound{{Listener: l, Name: "http"}}})
	if !got[ino1] || !got[ino2] || got[other] {
		t.Fatalf("serving inodes %v: want %d and %d (both on %s), not %d (another port)", got, ino1, ino2, addr, other)
	}
	if held := listenerInodes(&Spec{Listeners: []handoff.Bound{{Listener: l}}}); held[ino2] {
		t.Fatalf("listenerInodes %v holds the other socket of the group: the test shows nothing", held)
	}
}
