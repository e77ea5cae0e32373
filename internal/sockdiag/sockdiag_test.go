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

// reusePortListener opens a TCP listening socket on 127.0.0.1:port with
// SO_REUSEPORT and the given backlog; it returns the descriptor and the
// socket's inode.
func reusePortListener(t *testing.T, port, backlog int) (int, uint64) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return fd, st.Ino
}

// Each socket of a reuseport group is its own listener with its own
// accept queue and backlog, and the dump names each by the inode its
// holders see: how the agent reads a steered worker's queue. Connections
// made and never accepted wait in the sockets' queues; the dump sees all
// of them, and each socket's backlog as listen(2) set it.
func TestListenerQueuesByInode(t *testing.T) {
	fd1, ino1 := reusePortListener(t, 0, 7)
	sa, err := unix.Getsockname(fd1)
	if err != nil {
		t.Fatal(err)
	}
	p := sa.(*unix.SockaddrInet4).Port
	_, ino2 := reusePortListener(t, p, 9)
	const conns = 6
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p)).String()
	for range conns {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	backlogs := map[uint64]uint32{ino1: 7, ino2: 9}
	// Each handshake completes on the client's last ACK, which may reach
	// the listener a moment after connect returned.
	deadline := time.Now().Add(5 * time.Second)
	for {
		socks, err := TCP([]State{Listen}, func(s *Socket) bool { return s.Local.Port() == uint16(p) })
		if err != nil || len(socks) != 2 {
			t.Fatalf("listeners on port %d: %+v %v, want 2", p, socks, err)
		}
		var queued uint32
		for _, s := range socks {
			want, ok := backlogs[s.Inode]
			if !ok {
				t.Fatalf("listener %+v: inode %d is neither socket's (%d, %d)", s, s.Inode, ino1, ino2)
			}
			if s.SendQ != want || s.State != Listen {
				t.Fatalf("listener %+v: backlog %d, want %d", s, s.SendQ, want)
			}
			queued += s.RecvQ
		}
		if queued == conns {
			t.Logf("accept queues: %d and %d", socks[0].RecvQ, socks[1].RecvQ)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("accept queues hold %d connections, want %d: %+v", queued, conns, socks)
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

// BenchmarkListenDump is what the agent pays each second per steered
// app: one dump of the listening sockets on one port.
func BenchmarkListenDump(b *testing.B) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p := port(l)
	for b.Loop() {
		if _, err := TCP([]State{Listen}, func(s *Socket) bool { return s.Local.Port() == p }); err != nil {
			b.Fatal(err)
		}
	}
}
