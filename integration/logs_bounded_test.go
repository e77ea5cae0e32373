package integration

// A control client that asks for a long answer and never reads it holds
// no more than a small fixed buffer of the agent, and only until its
// write deadline drops it.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
)

// stalledCallers, the write deadline of the control API (control's
// controlWriteTimeout) and how many lines the app writes.
const (
	stalledCallers    = 16
	controlWriteLimit = 30 * time.Second
	boundedLogLines   = 100_000
)

// TestStalledLogCallersHoldLittle: 16 control connections ask for the last
// 100 000 lines of a log (4 of them with follow) and never read the answer. The agent's peak RSS
// stays under 100 MiB (the answers were read whole into memory: each such
// call held its lines until the client read them, for ever, and 16 took
// the agent to hundreds of MiB), status answers meanwhile, the callers are
// dropped after the write deadline, and then a normal `logs -n 100000`
// prints every line, as the file has them.
func TestStalledLogCallersHoldLittle(t *testing.T) {
	parallel(t)
	a := StartAgent(t, bins, appConfig("web", FreePort(t), 1,
		fmt.Sprintf("env = { TESTAPP_LOG_SPAM = \"%d\" }\n", boundedLogLines)))
	logFile := filepath.Join(a.Dir, "logs", "web.out.log")
	want := waitSpamLines(t, a, logFile)

	hwm0 := vmHWM(t, a.PID())
	limit := 100 << 10 // KiB
	if RaceBuild() {
		limit = hwm0 + 80<<10 // a race-built agent starts larger
	}
	conns := stallLogCalls(t, a.Socket, stalledCallers)
	hwm := vmHWM(t, a.PID())
	t.Logf("agent peak RSS %d KiB before, %d KiB with %d stalled `logs -n %d` calls: %d KiB per call",
		hwm0, hwm, stalledCallers, boundedLogLines, (hwm-hwm0)/stalledCallers)
	if hwm > limit {
		t.Errorf("the agent's peak RSS reached %d KiB with %d stalled log calls; want under %d KiB", hwm, stalledCallers, limit)
	}

	t0 := time.Now()
	if _, err := statusOrErr(a, 5*time.Second); err != nil {
		t.Fatalf("status while %d log calls stall: %v", stalledCallers, err)
	}
	t.Logf("status answered in %s while they stall", time.Since(t0).Round(time.Microsecond))

	waitDropped(t, conns, controlWriteLimit+15*time.Second)
	// net/http closes a connection at the failed write; the call ends and
	// logs the drop just after.
	const dropped = "logs client dropped: it took nothing of its answer for too long"
	for deadline := time.Now().Add(10 * time.Second); strings.Count(a.Log(), dropped) < stalledCallers; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent log says %d logs clients were dropped, want %d", strings.Count(a.Log(), dropped), stalledCallers)
		}
	}

	r := a.CLI("logs", "web", "--out", "-n", fmt.Sprint(boundedLogLines))
	if r.Code != 0 {
		t.Fatalf("logs -n %d after the stalled calls were dropped: exit %d\n%s", boundedLogLines, r.Code, r.Stderr)
	}
	if r.Stdout != want {
		t.Errorf("logs -n %d printed %d lines (%d bytes); want the file's last %d lines (%d bytes)\n%s",
			boundedLogLines, strings.Count(r.Stdout, "\n"), len(r.Stdout), boundedLogLines, len(want), tailOf(r.Stdout, 3))
	}
}

// waitSpamLines waits until the app's log holds its 100 000 spam lines and
// returns the file's last 100 000 lines.
func waitSpamLines(t *testing.T, a *Agent, path string) string {
	t.Helper()
	last := fmt.Sprintf(" %d\n", boundedLogLines) // lines 1 to 100 000
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && bytes.HasSuffix(b, []byte(last)) && bytes.Count(b, []byte("] line ")) >= boundedLogLines {
			lines := bytes.SplitAfter(b, []byte("\n"))
			lines = lines[:len(lines)-1] // "" after the last newline
			return string(bytes.Join(lines[len(lines)-boundedLogLines:], nil))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app's %d lines are not in %s after 60s (%d bytes, %v)\n%s", boundedLogLines, path, len(b), err, a.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stallLogCalls opens n control connections that each ask for the last
// 100 000 lines of web's log (a quarter of them then to follow it) and
// never read; it returns once the agent
// has sent each of them more than it can take (its answer has started and
// the socket is full), and closes them when the test ends.
func stallLogCalls(t *testing.T, socket string, n int) []*net.UnixConn {
	t.Helper()
	var conns []*net.UnixConn
	for i := range n {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
		follow := i%4 == 3 // a quarter of them as `logs -f -n 100000`
		req := fmt.Sprintf("GET %s?app=web&n=%d&follow=%t HTTP/1.1\r\nHost: deployd\r\n\r\n", api.PathLogs, boundedLogLines, follow)
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, c := range conns {
		for queued(t, c) < 64<<10 {
			if time.Now().After(deadline) {
				t.Fatalf("connection %d: only %d bytes of the answer after 30s", i, queued(t, c))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return conns
}

// queued is how many bytes wait to be read on c (SIOCINQ).
func queued(t *testing.T, c *net.UnixConn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatalf("SIOCINQ: %v %v", err, ierr)
	}
	return n
}

// waitDropped waits (at most d) until the agent has closed every one of
// conns, without reading them: the kernel reports the peer's close
// (POLLRDHUP) while the unread answer is still queued.
func waitDropped(t *testing.T, conns []*net.UnixConn, d time.Duration) {
	t.Helper()
	t0 := time.Now()
	for i, c := range conns {
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var rev int16
		var perr error
		_ = raw.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			for {
				left := d - time.Since(t0)
				if left <= 0 {
					return
				}
				_, perr = unix.Poll(pfd, int(left.Milliseconds())+1)
				if perr != unix.EINTR {
					rev = pfd[0].Revents
					return
				}
			}
		})
		if perr != nil || rev&unix.POLLRDHUP == 0 {
			t.Fatalf("stalled connection %d still open %s after the answers began (%v): the agent did not drop it",
				i, time.Since(t0).Round(time.Millisecond), perr)
		}
	}
	t.Logf("the agent dropped the %d stalled connections within %s of their stall", len(conns), time.Since(t0).Round(time.Millisecond))
}
