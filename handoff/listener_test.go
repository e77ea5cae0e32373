package handoff

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fdOf is l's descriptor; the test fails if l is closed.
func fdOf(t testing.TB, l *Listener) uintptr {
	t.Helper()
	fd, err := l.Fd()
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// mustOpen calls Open and closes the listener when the test ends.
func mustOpen(t testing.TB, network, address string, nonblocking bool) *Listener {
	t.Helper()
	l, err := Open(network, address, nonblocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// nonblock reads O_NONBLOCK of fd straight from the kernel.
func nonblock(t testing.TB, fd uintptr) bool {
	t.Helper()
	flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		t.Fatalf("fcntl F_GETFL %d: %v", fd, err)
	}
	return flags&unix.O_NONBLOCK != 0
}

// dialable reports whether a connection to the address is accepted by the
// kernel (a listening socket queues it even when nobody accepts).
func dialable(network, address string) bool {
	c, err := net.DialTimeout(network, address, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestOpenTCPBusyPort(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()

	before := fdCount(t)
	l, err := Open("tcp", addr, false)
	if err == nil {
		l.Close()
		t.Fatalf("Open(%s) on a busy port: no error", addr)
	}
	if !errors.Is(err, ErrAddressInUse) {
		t.Errorf("error does not wrap ErrAddressInUse: %v", err)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error does not wrap EADDRINUSE: %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, addr) {
		t.Errorf("error does not name the address %s: %v", addr, err)
	}
	if !strings.Contains(msg, "stop it or choose another address") {
		t.Errorf("error does not say how to fix it: %v", err)
	}
	if after := fdCount(t); after != before {
		t.Errorf("failed Open leaked descriptors: %d before, %d after", before, after)
	}
}

func TestOpenTCP(t *testing.T) {
	for _, nb := range []bool{false, true} {
		l := mustOpen(t, "tcp", "127.0.0.1:0", nb)
		if l.Network != "tcp" || l.Address != "127.0.0.1:0" || l.Inherited {
			t.Errorf("fields: %+v", l)
		}
		if fdOf(t, l) < 3 {
			t.Errorf("Fd() = %d, want a descriptor above stdio", fdOf(t, l))
		}
		if got := nonblock(t, fdOf(t, l)); got != nb {
			t.Errorf("Open(nonblocking=%v): O_NONBLOCK = %v", nb, got)
		}
		if got, err := l.Nonblocking(); err != nil || got != nb {
			t.Errorf("Nonblocking() = %v, %v; want %v", got, err, nb)
		}
		flags, err := unix.FcntlInt(fdOf(t, l), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("listener fd is not close-on-exec (flags %#x, %v)", flags, err)
		}
		addr, err := l.LocalAddr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" || port == "0" {
			t.Errorf("LocalAddr() = %q (%v), want 127.0.0.1 and a real port", addr, err)
		}
		if !dialable("tcp", addr) {
			t.Errorf("nothing listens on %s", addr)
		}
		if l.Key() != Key("tcp", "127.0.0.1:0") || l.Key() != "deployd-listener:tcp:127.0.0.1:0" {
			t.Errorf("Key() = %q", l.Key())
		}
	}
}

func TestOpenTCP6LocalAddr(t *testing.T) {
	l, err := Open("tcp6", "[::1]:0", false)
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer l.Close()
	addr, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "[::1]:") || strings.HasSuffix(addr, ":0") {
		t.Errorf("LocalAddr() = %q, want [::1]:port", addr)
	}
}

func TestListenerCloseTwice(t *testing.T) {
	before := fdCount(t)
	l, err := Open("tcp", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := l.LocalAddr()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if dialable("tcp", addr) {
		t.Errorf("%s still accepts after Close", addr)
	}
	if after := fdCount(t); after != before {
		t.Errorf("%d descriptors before Open, %d after Close", before, after)
	}
}

func TestOpenUnix(t *testing.T) {
	path := filepath.Join(shortDir(t), "app.sock")
	l := mustOpen(t, "unix", path, true)
	if got, err := l.LocalAddr(); err != nil || got != path {
		t.Errorf("LocalAddr() = %q, %v; want %q", got, err, path)
	}
	if !nonblock(t, fdOf(t, l)) {
		t.Error("O_NONBLOCK not set")
	}
	if !dialable("unix", path) {
		t.Errorf("nothing listens on %s", path)
	}
	// The socket file outlives the agent's copy: workers keep theirs.
	l.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("socket file removed by Close: %v", err)
	}
}

func TestOpenUnixReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "stale.sock")
	old, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false)
	old.Close()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no stale socket file left behind: %v", err)
	}
	if dialable("unix", path) {
		t.Fatal("the stale socket still accepts")
	}

	l := mustOpen(t, "unix", path, false)
	if !dialable("unix", path) {
		t.Errorf("the replaced socket %s does not accept", path)
	}
	if got, _ := l.LocalAddr(); got != path {
		t.Errorf("LocalAddr() = %q, want %q", got, path)
	}
}

func TestOpenUnixRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "live.sock")
	live, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	l, err := Open("unix", path, false)
	if err == nil {
		l.Close()
		t.Fatal("Open took over a socket another process serves")
	}
	if !errors.Is(err, ErrAddressInUse) {
		t.Errorf("error does not wrap ErrAddressInUse: %v", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error does not name %s: %v", path, err)
	}
	if !dialable("unix", path) {
		t.Error("the live socket was disturbed")
	}
}

func TestOpenUnixRefusesRegularFile(t *testing.T) {
	path := filepath.Join(shortDir(t), "not-a-socket")
	if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open("unix", path, false)
	if err == nil {
		l.Close()
		t.Fatal("Open replaced a regular file")
	}
	if !strings.Contains(err.Error(), "not a socket") || !strings.Contains(err.Error(), path) {
		t.Errorf("error should name the path and say it is not a socket: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep me" {
		t.Errorf("the file was touched: %q, %v", b, err)
	}
}

// fakeStore is a map-based Store, like tableflip's Fds.
type fakeStore struct {
	files   map[string]*os.File
	added   map[string]*os.File
	fileErr error
	addErr  error
}

func newFakeStore() *fakeStore {
	return &fakeStore{files: map[string]*os.File{}, added: map[string]*os.File{}}
}

func (s *fakeStore) File(name string) (*os.File, error) {
	if s.fileErr != nil {
		return nil, s.fileErr
	}
	return s.files[name], nil // nil, nil when absent, as tableflip does
}

func (s *fakeStore) AddFile(name string, f *os.File) error {
	if s.addErr != nil {
		return s.addErr
	}
	s.added[name] = f
	return nil
}

func TestAcquireInherited(t *testing.T) {
	// The "previous agent" made a nonblocking socket; the new one asks for
	// blocking and must keep the inherited flags anyway.
	prev := mustOpen(t, "tcp", "127.0.0.1:0", true)
	addr, err := prev.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	store := newFakeStore()
	store.files[Key("tcp", addr)] = prev.file

	l, err := Acquire(store, "tcp", addr, false)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Inherited {
		t.Error("inherited listener not marked Inherited")
	}
	if fdOf(t, l) != fdOf(t, prev) {
		t.Errorf("Fd() = %d, want the inherited %d", fdOf(t, l), fdOf(t, prev))
	}
	if !nonblock(t, fdOf(t, l)) {
		t.Error("the inherited socket's O_NONBLOCK was changed")
	}
	if l.Network != "tcp" || l.Address != addr {
		t.Errorf("fields: %+v", l)
	}
	// tableflip keeps what File returned for the next handoff: adding it
	// again would pass the socket twice.
	if len(store.added) != 0 {
		t.Errorf("inherited file added to the store again: %v", store.added)
	}
	if got, _ := l.LocalAddr(); got != addr {
		t.Errorf("LocalAddr() = %q, want %q", got, addr)
	}
}

func TestAcquireNew(t *testing.T) {
	store := newFakeStore()
	l, err := Acquire(store, "tcp", "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Inherited {
		t.Error("new listener marked Inherited")
	}
	if !nonblock(t, fdOf(t, l)) {
		t.Error("O_NONBLOCK not set as asked")
	}
	f := store.added[Key("tcp", "127.0.0.1:0")]
	if f == nil || f != l.file {
		t.Fatalf("new listener not registered under %q: %v", Key("tcp", "127.0.0.1:0"), store.added)
	}
}

func TestAcquireNilStore(t *testing.T) {
	l, err := Acquire(nil, "tcp", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Inherited || nonblock(t, fdOf(t, l)) {
		t.Errorf("Inherited=%v nonblocking=%v, want false, false", l.Inherited, nonblock(t, fdOf(t, l)))
	}
}

func TestAcquireStoreErrors(t *testing.T) {
	boom := errors.New("boom")

	store := newFakeStore()
	store.fileErr = boom
	if _, err := Acquire(store, "tcp", "127.0.0.1:0", false); !errors.Is(err, boom) {
		t.Errorf("File error: got %v, want it wrapped", err)
	}

	before := fdCount(t)
	store = newFakeStore()
	store.addErr = boom
	l, err := Acquire(store, "tcp", "127.0.0.1:0", false)
	if l != nil {
		l.Close()
	}
	if !errors.Is(err, boom) {
		t.Errorf("AddFile error: got %v, want it wrapped", err)
	}
	if after := fdCount(t); after != before {
		t.Errorf("failed Acquire leaked the socket: %d fds before, %d after", before, after)
	}
}

func TestAdopt(t *testing.T) {
	prev := mustOpen(t, "tcp", "127.0.0.1:0", false)
	l := Adopt(prev.file, "tcp", "127.0.0.1:8080")
	if !l.Inherited || fdOf(t, l) != fdOf(t, prev) {
		t.Errorf("Adopt: %+v", l)
	}
	if nonblock(t, fdOf(t, l)) {
		t.Error("Adopt changed O_NONBLOCK")
	}
}
