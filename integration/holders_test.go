package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/sockdiag"
)

// portHolders returns the processes that hold a TCP socket listening on
// 127.0.0.1:port, as the kernel tells: the sockets from sock_diag (every
// member of a reuseport group), their holders from /proc/PID/fd. The test
// process itself is left out.
func portHolders(t *testing.T, port int) map[int]bool {
	t.Helper()
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(k *sockdiag.Socket) bool {
		return int(k.Local.Port()) == port
	})
	if err != nil {
		t.Fatalf("dump the listening sockets: %v", err)
	}
	inodes := map[uint64]bool{}
	for _, k := range socks {
		inodes[k.Inode] = true
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		held, err := sockdiag.Inodes(pid)
		if err != nil {
			continue
		}
		for ino := range held {
			if inodes[ino] {
				out[pid] = true
			}
		}
	}
	return out
}

// onlyListedServe fails the test if a process other than the agent and
// the workers status lists (current ones, not draining) holds a socket
// listening on the port.
func onlyListedServe(t *testing.T, a *Agent, port int, when string) {
	t.Helper()
	listed := map[int]bool{a.PID(): true}
	for _, w := range appOf(a.Status(), "web").Workers {
		listed[w.PID] = true
	}
	for pid := range portHolders(t, port) {
		if !listed[pid] {
			t.Errorf("%s: pid %d (%s) listens on port %d; status lists the workers %v", when, pid,
				commandOf(pid), port, listed)
		}
	}
}

// commandOf is pid's command line, for a failure message.
func commandOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	for i := range b {
		if b[i] == 0 {
			b[i] = ' '
		}
	}
	return string(b)
}

// TestStrayListenerKilledAfterAdoptingStart: after an adopting start,
// every process that holds one of an app's listening sockets is a worker
// the agent supervises. Here, while no agent runs (a SIGKILL), a process
// that no agent started and no record names gets a copy of web's
// listening socket (as a worker started while its agent died would hold
// it); the next agent adopts the workers and then kills that process
// through a pidfd, with a log line naming the app, its pid, command and
// why. Before the check it served on, outside status (issue 40).
func TestStrayListenerKilledAfterAdoptingStart(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, ""))
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := allWorkerPIDs(st)
	pid := a.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid, 10*time.Second)
	rogue, rogueExited := holdListenerCopy(t, keys(before)[0], port)
	a.Start()
	st = a.WaitFor("ready under the next agent", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	if now := allWorkerPIDs(st); !samePIDs(now, before) {
		t.Fatalf("workers %v after the SIGKILL, %v before: not adopted\n%s", keys(now), keys(before), a.Log())
	}
	line := waitLogLine(t, a, "the stray holder killed", "killed a process that held an app's listening socket",
		fmt.Sprintf("pid=%d", rogue))
	for _, want := range []string{"app=web", "command=", "sleep", "why=", "not a worker this agent supervises"} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q lacks %q", line, want)
		}
	}
	select {
	case <-rogueExited:
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d, which held web's listener, still runs after the adopting start\n%s", rogue, a.Log())
	}
	onlyListedServe(t, a, port, "after the adopting start")
	waitLogLine(t, a, "the check's summary", "checked the holders of the apps' listening sockets", "killed=1")
}

// holdListenerCopy starts `sleep` holding, at fd 3, a copy of the socket
// listening on port that worker pid holds (pidfd_getfd), in a process
// group of its own and with none of deployd's variables: a process no
// agent knows. It returns its pid and a channel closed when it exited; it
// is killed when the test ends, if still running.
func holdListenerCopy(t *testing.T, pid, port int) (int, <-chan struct{}) {
	t.Helper()
	fd := listenerFdOf(t, pid, port)
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	got, err := unix.PidfdGetfd(pfd, fd, 0)
	if err != nil {
		t.Fatalf("pidfd_getfd %d of %d: %v", fd, pid, err)
	}
	f := os.NewFile(uintptr(got), "listener")
	defer f.Close()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	cmd := exec.Command(sleep, "600")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = CleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return cmd.Process.Pid, exited
}

// listenerFdOf is the fd number at which pid holds a socket listening on
// port.
func listenerFdOf(t *testing.T, pid, port int) int {
	t.Helper()
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(k *sockdiag.Socket) bool {
		return int(k.Local.Port()) == port
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		link, _ := os.Readlink(filepath.Join(dir, e.Name()))
		for _, k := range socks {
			if link == fmt.Sprintf("socket:[%d]", k.Inode) {
				n, _ := strconv.Atoi(e.Name())
				return n
			}
		}
	}
	t.Fatalf("worker %d holds no socket listening on port %d", pid, port)
	return 0
}
