package bindtrap

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nobody is the unprivileged user the test workers run as.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

// binaries builds the self-binding server and copies the test binary (the
// shim) into a folder every user can read.
func binaries(t *testing.T) (shim, server string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("skipped: needs root (workers run as nobody; the agent reads their memory)")
	}
	if err := Supported(); err != nil {
		t.Skipf("skipped: %v", err)
	}
	dir, err := os.MkdirTemp("", "bindtrap-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	server = filepath.Join(dir, "selfbind")
	cmd := exec.Command("go", "build", "-o", server, "./integration/selfbind")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build selfbind: %v\n%s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shim = filepath.Join(dir, "shim")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shim, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return shim, server
}

// worker is a self-binding server started through the shim.
type worker struct {
	pid    int
	notify *os.File      // the agent's copy
	out    *bufio.Reader // its stdout
	stdin  *os.File
}

// startWorker starts server as nobody through the shim, the notify
// socketpair's child end at fd 3, and receives the notify fd.
func startWorker(t *testing.T, shim, server string, env ...string) *worker {
	t.Helper()
	return startWorkerArgv(t, shim, []string{server}, env...)
}

// startWorkerArgv is startWorker for any command.
func startWorkerArgv(t *testing.T, shim string, argv []string, env ...string) *worker {
	t.Helper()
	agentEnd, child, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer agentEnd.Close()
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	env = append(env, envShim+"=3", "PATH=/usr/bin:/bin")
	pid, err := syscall.ForkExec(shim, append([]string{shim}, argv...), &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{inR.Fd(), outW.Fd(), os.Stderr.Fd(), child.Fd()},
		Sys:   &syscall.SysProcAttr{Credential: nobody, Setpgid: true},
	})
	child.Close()
	inR.Close()
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // its group: what it started too
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		outR.Close()
		inW.Close()
	})
	nf, err := Receive(agentEnd, 5*time.Second)
	if err != nil {
		t.Fatalf("receive the notify fd of %d: %v", pid, err)
	}
	return &worker{pid: pid, notify: nf, out: bufio.NewReader(outR), stdin: inW}
}

// line reads the worker's next output line, with a deadline.
func (w *worker) line(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() { s, _ := w.out.ReadString('\n'); got <- strings.TrimSpace(s) }()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("worker %d said nothing within 10 s", w.pid)
		return ""
	}
}

// stop sends SIGTERM and waits for a clean exit (Shutdown must return:
// the shared socket is non-blocking, so the app's accept is in the poller).
func (w *worker) stop(t *testing.T) {
	t.Helper()
	_ = syscall.Kill(w.pid, syscall.SIGTERM)
	done := make(chan syscall.WaitStatus, 1)
	go func() {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(w.pid, &ws, 0, nil)
		done <- ws
	}()
	select {
	case ws := <-done:
		if ws.ExitStatus() != 0 {
			t.Errorf("worker %d exited %v after SIGTERM, want 0", w.pid, ws)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("worker %d still runs 10 s after SIGTERM: its Shutdown hangs", w.pid)
	}
}

func listenLoopback(t *testing.T) (*net.TCPListener, Listen) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ap := netip.MustParseAddrPort(l.Addr().String())
	return l.(*net.TCPListener), Listen{Addr: ap, Sock: l.(*net.TCPListener), Name: "web"}
}

// pidsServing sends new-connection requests until every pid in want
// answered (or the deadline) and returns the answers per pid.
func pidsServing(t *testing.T, port int, want ...int) map[int]int {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	seen := map[int]int{}
	deadline := time.Now().Add(15 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ { // at least 40 requests
		resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
		if err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_, p, _ := strings.Cut(string(b), "pid=")
		p, _, _ = strings.Cut(p, " ")
		pid, _ := strconv.Atoi(p)
		seen[pid]++
		all := n >= 40
		for _, w := range want {
			all = all && seen[w] > 0
		}
		if all {
			return seen
		}
	}
	t.Fatalf("within 15 s, answers per pid %v, want every one of %v", seen, want)
	return nil
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// Two unprivileged Go servers that each ListenAndServe(":P") both serve
// from the agent's one socket on 127.0.0.1:P; a bind of another TCP port
// and a UDP bind of P run as the app asked.
func TestTwoSelfBindingServersShareTheAgentSocket(t *testing.T) {
	shim, server := binaries(t)
	ln, web := listenLoopback(t)
	port := int(web.Addr.Port())
	// The agent's socket starts blocking (nonblocking = false): the
	// answer gives it the mode of the app's own socket, non-blocking, or
	// Go's Shutdown would hang in a blocking accept.
	raw, _ := ln.SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = unix.SetNonblock(int(fd), false) })
	extra, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	extraPort := extra.Addr().(*net.TCPAddr).Port
	extra.Close()

	env := []string{"PORT=" + strconv.Itoa(port), "APP_VERSION=v1"}
	a := startWorker(t, shim, server, append(env, "EXTRA_TCP="+strconv.Itoa(extraPort), "UDP=1")...)
	b := startWorker(t, shim, server, env...)
	ta, tb := Serve(a.notify, Match([]Listen{web}), nil), Serve(b.notify, Match([]Listen{web}), nil)
	defer ta.Close()
	defer tb.Close()

	if got, want := a.line(t), "extra-tcp ok 127.0.0.1:"+strconv.Itoa(extraPort); got != want {
		t.Errorf("a bind of a port no listen names: %q, want %q", got, want)
	}
	if got, want := a.line(t), "udp ok [::]:"+strconv.Itoa(port); got != want {
		t.Errorf("a UDP bind of the listen's port: %q, want %q", got, want)
	}
	for _, w := range []*worker{a, b} {
		if got := w.line(t); !strings.HasPrefix(got, "listening") {
			t.Fatalf("worker %d: %q", w.pid, got)
		}
	}
	seen := pidsServing(t, port, a.pid, b.pid)
	t.Logf("answers per pid: %v", seen)

	// The app's fd is the agent's socket: same inode.
	var agentFD uintptr
	_ = raw.Control(func(fd uintptr) { agentFD = fd })
	want := inode(t, "/proc/self/fd/"+strconv.Itoa(int(agentFD)))
	for _, w := range []*worker{a, b} {
		if !holdsInode(t, w.pid, want) {
			t.Errorf("worker %d holds no fd of the agent's socket (inode %d)", w.pid, want)
		}
	}
	// Go's runtime binds probe sockets to port 0 as well (IPv6 support):
	// seen counts them.
	for tr, wantSeen := range map[*Trap]int{ta: 3, tb: 1} {
		ans, seen := tr.Answered()
		if ans["web"] != 1 || seen < wantSeen {
			t.Errorf("trap answered %v of %d binds, want web:1 of at least %d", ans, seen, wantSeen)
		}
	}
	a.stop(t)
	b.stop(t)
	if nb, err := unix.FcntlInt(agentFD, unix.F_GETFL, 0); err != nil || nb&unix.O_NONBLOCK == 0 {
		t.Errorf("the agent's socket is blocking (flags %#x, %v), the app's was not", nb, err)
	}
}

// holdsInode reports whether one of pid's fds is the socket with inode ino.
func holdsInode(t *testing.T, pid int, ino uint64) bool {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == "socket:["+strconv.FormatUint(ino, 10)+"]" {
			return true
		}
	}
	return false
}

// A bind made while no agent answers waits (the worker keeps the notify
// fd, so the kernel does not fail it with ENOSYS), and the next agent,
// which copies the notify fd out of the worker, answers it.
func TestBindWithNoAgentWaitsForTheNext(t *testing.T) {
	shim, server := binaries(t)
	_, web := listenLoopback(t)
	port := int(web.Addr.Port())
	w := startWorker(t, shim, server, "PORT="+strconv.Itoa(port), "WAIT_STDIN=1")
	first := Serve(w.notify, Match([]Listen{web}), nil)
	if got := w.line(t); got != "waiting" {
		t.Fatalf("worker: %q", got)
	}
	// The agent dies: its copy of the notify fd goes.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.stdin.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
	if got := w.line(t); !strings.HasPrefix(got, "listening") {
		t.Fatalf("worker: %q", got)
	}
	// The kernel says the worker waits in bind(2).
	deadline := time.Now().Add(10 * time.Second)
	for !inSyscall(w.pid, unix.SYS_BIND) {
		if time.Now().After(deadline) {
			t.Fatalf("worker %d is not waiting in bind 10 s after it was asked to bind", w.pid)
		}
		time.Sleep(10 * time.Millisecond) // polling a kernel fact, no event for it
	}
	// The next agent copies the notify fd the worker keeps at fd 3.
	pfd, err := unix.PidfdOpen(w.pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	nfd, err := unix.PidfdGetfd(pfd, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NotifyFile(nfd)
	if err != nil {
		t.Fatal(err)
	}
	next := Serve(f, Match([]Listen{web}), nil)
	defer next.Close()
	pidsServing(t, port, w.pid)
	w.stop(t)
}

// inSyscall reports whether a thread of pid is in system call nr
// (/proc/PID/task/TID/syscall: the number first).
func inSyscall(pid, nr int) bool {
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/syscall")
		if err == nil && strings.HasPrefix(string(b), strconv.Itoa(nr)+" ") {
			return true
		}
	}
	return false
}

// A process the worker starts (here a shell that runs the server as its
// child, as npm or a start script would) inherits the filter: its bind is
// answered too.
func TestBindOfAWorkersChildIsAnswered(t *testing.T) {
	shim, server := binaries(t)
	_, web := listenLoopback(t)
	port := int(web.Addr.Port())
	w := startWorkerArgv(t, shim, []string{"/bin/sh", "-c", server + "; exit $?"}, "PORT="+strconv.Itoa(port))
	tr := Serve(w.notify, Match([]Listen{web}), nil)
	defer tr.Close()
	if got := w.line(t); !strings.HasPrefix(got, "listening") {
		t.Fatalf("worker: %q", got)
	}
	seen := pidsServing(t, port)
	for pid := range seen {
		if pid == w.pid {
			t.Errorf("the shell %d answered; want its child", pid)
		}
	}
	if ans, _ := tr.Answered(); ans["web"] != 1 {
		t.Errorf("trap answered %v, want web:1", ans)
	}
}

// An answered bind returns 0, as bind(2) does: libc callers that test the
// result against 0 (the JDK) take anything else for a failure.
func TestAnsweredBindReturnsZero(t *testing.T) {
	shim, _ := binaries(t)
	_, web := listenLoopback(t)
	port := strconv.Itoa(int(web.Addr.Port()))
	w := startWorkerArgv(t, shim, []string{shim}, envProbe+"="+port)
	tr := Serve(w.notify, Match([]Listen{web}), nil)
	defer tr.Close()
	if got, want := w.line(t), "bind returned 0 errno 0"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if ans, _ := tr.Answered(); ans["web"] != 1 {
		t.Errorf("trap answered %v, want web:1", ans)
	}
}
