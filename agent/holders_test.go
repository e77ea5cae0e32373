package agent

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
)

// holdCopy starts sleep(1) holding a copy of l at fd 3, stopped when the
// test ends; it returns its pid and the socket's inode.
func holdCopy(t *testing.T, l *net.TCPListener) (pid int, ino uint64) {
	t.Helper()
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	cmd := exec.Command(sleep, "60")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid, st.Ino
}

// TestSocketHoldersAndTheirKill: the scan finds the process that holds a
// copy of a listening socket (not the test itself, an ancestor), and
// holders.kill SIGKILLs it through a pidfd and logs app, pid, command and
// why; a holder whose start time is not the process's is left alone.
func TestSocketHoldersAndTheirKill(t *testing.T) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pid, ino := holdCopy(t, l)
	socks := map[uint64]appSocket{ino: {app: "web", listen: "tcp " + l.Addr().String()}}
	hs := socketHolders(socks, ancestors())
	if len(hs) != 1 || hs[0].pid != pid || hs[0].ino != ino {
		t.Fatalf("holders %+v, want pid %d holding inode %d alone", hs, pid, ino)
	}
	var out bytes.Buffer
	a := &holders{stateDir: t.TempDir(), log: hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})}
	stale := hs[0]
	stale.start++
	if a.kill(stale, "a test") || !handoff.Running(pid, hs[0].start) {
		t.Fatal("holders.kill killed a process whose start time differs from the holder's")
	}
	if !a.kill(hs[0], "a test") {
		t.Fatalf("holders.kill did not kill pid %d\n%s", pid, out.String())
	}
	if handoff.Running(pid, hs[0].start) {
		t.Fatalf("pid %d still runs after holders.kill", pid)
	}
	for _, want := range []string{"killed a process that held an app's listening socket", "app=web",
		"pid=" + strconv.Itoa(pid), "command=", "sleep 60", "why=\"a test\""} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}
}
