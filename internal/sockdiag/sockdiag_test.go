package sockdiag

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen returns a TCP listener on loopback (network "tcp4" or "tcp6").
func listen(t *testing.T, network, addr string) *net.TCPListener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

func port(l net.Listener) uint16 { return l.Addr().(*net.TCPAddr).AddrPort().Port() }

// connect makes n connections to l and accepts them; it returns the
// accepted (server) ends.
func connect(t *testing.T, l *net.TCPListener, n int) []*net.TCPConn {
	t.Helper()
	var out []*net.TCPConn
	for range n {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		l.SetDeadline(time.Now().Add(5 * time.Second))
		s, err := l.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

// The established sockets whose local port is a listener's are its
// accepted ends (not the client ends), with this process's uid, and their
// inodes are among the ones /proc/self/fd holds.
func TestEstablishedOnPort(t *testing.T) {
	for _, c := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		t.Run(c.network, func(t *testing.T) {
			l, err := net.Listen(c.network, c.addr)
			if err != nil && c.network == "tcp6" && os.Getenv("CI") == "" {
				t.Skipf("no IPv6 loopback: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			p := port(l)
			accepted := connect(t, l.(*net.TCPListener), 3)
			socks, err := TCP([]State{Established}, func(s *Socket) bool { return s.Local.Port() == p })
			if err != nil {
				t.Fatal(err)
			}
			if len(socks) != 3 {
				t.Fatalf("%d established sockets with local port %d, want 3: %+v", len(socks), p, socks)
			}
			mine, err := Inodes(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			want := netip.MustParseAddrPort(l.Addr().String()).Addr()
			for _, s := range socks {
				if s.State != Established || s.Local.Addr() != want || s.UID != uint32(os.Getuid()) {
					t.Errorf("socket %+v: want state %d, local address %s, uid %d", s, Established, want, os.Getuid())
				}
				if !mine[s.Inode] {
					t.Errorf("socket %+v: inode %d not among this process's descriptors", s, s.Inode)
				}
			}
			// Closing one accepted end takes it out of the established ones.
			accepted[0].Close()
			socks, err = TCP([]State{Established}, func(s *Socket) bool { return s.Local.Port() == p })
			if err != nil || len(socks) != 2 {
				t.Fatalf("after closing one: %d sockets (%v), want 2", len(socks), err)
			}
		})
	}
}

// A listener's RecvQ is its accept queue: connections made and not
// accepted yet.
func TestListenerAcceptQueue(t *testing.T) {
	l := listen(t, "tcp4", "127.0.0.1:0")
	p := port(l)
	for range 2 {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	// The server side of a handshake completes on the client's last ACK,
	// which may come a moment after the client's connect returned.
	deadline := time.Now().Add(5 * time.Second)
	for {
		socks, err := TCP([]State{Listen}, func(s *Socket) bool { return s.Local.Port() == p })
		if err != nil || len(socks) != 1 {
			t.Fatalf("listeners on port %d: %+v %v", p, socks, err)
		}
		if socks[0].RecvQ == 2 {
			if socks[0].SendQ == 0 {
				t.Errorf("the listener's backlog reads 0: %+v", socks[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("accept queue %d, want 2", socks[0].RecvQ)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNoState(t *testing.T) {
	if _, err := TCP(nil, nil); err == nil {
		t.Fatal("a dump of no state: no error")
	}
}

func TestInodesOfNoProcess(t *testing.T) {
	if _, err := Inodes(1 << 30); !os.IsNotExist(err) {
		t.Fatalf("Inodes of a pid that cannot exist: %v, want not exist", err)
	}
}

// Another user's process (pid 1, root's) is not readable but by root:
// the error says so, for the caller to report "unknown" rather than 0.
func TestInodesOfAnotherUser(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/1", &st); err != nil {
		t.Fatal(err)
	}
	_, err := Inodes(1)
	switch {
	case os.Geteuid() == 0 || int(st.Uid) == os.Geteuid():
		if err != nil {
			t.Fatalf("Inodes(1) as uid %d (pid 1 is uid %d's): %v", os.Geteuid(), st.Uid, err)
		}
	case !errors.Is(err, os.ErrPermission):
		t.Fatalf("Inodes(1) as uid %d (pid 1 is uid %d's): %v, want a permission error", os.Geteuid(), st.Uid, err)
	}
}
