package integration

import (
	"os"
	"strconv"
	"testing"

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
