package handoff

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// helperEnv selects a helper behaviour when the test binary runs as a child.
const helperEnv = "DEPLOYD_HANDOFF_TEST_HELPER"

// noRaceExitSleep keeps a race-enabled helper from sleeping 1 s at exit
// (the race runtime's atexit_sleep_ms default).
const noRaceExitSleep = "GORACE=atexit_sleep_ms=0"

// helperLifetime bounds every helper process, so that a failed test cannot
// leave one behind for long.
const helperLifetime = 20 * time.Second

// helpers are the behaviours of the test binary when it runs as a child
// (the os/exec tests' helper-process habit). Each returns the exit code.
var helpers = map[string]func() int{
	"print-env":      helperPrintEnv,
	"notify-send":    helperNotifySend,
	"symlink":        helperSymlink,
	"steer-fallback": helperSteerFallback,
}

// helperSymlink makes a symlink at $SYMLINK_AT to $SYMLINK_TARGET: what a
// worker's user would plant for the root agent to follow.
func helperSymlink() int {
	if err := os.Symlink(os.Getenv("SYMLINK_TARGET"), os.Getenv("SYMLINK_AT")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// The parent-death signal is a per-thread attribute that only the thread
// that called execve has (new threads start without it), so a helper that
// reads it must run on the main thread: locking in init makes main run there.
func init() {
	if os.Getenv(helperEnv) != "" {
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		os.Exit(RunShim(os.Args[2:]))
	}
	if name := os.Getenv(helperEnv); name != "" {
		h, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
			os.Exit(2)
		}
		time.AfterFunc(helperLifetime, func() { os.Exit(99) })
		os.Exit(h())
	}
	goleak.VerifyTestMain(m)
}

// childReport is what the print-env helper sees of the worker contract.
type childReport struct {
	PID           int
	ListenFDs     string
	ListenPID     string
	ListenFDNames string
	NotifySocket  string
	// Socknames and Nonblock are per listener fd 3..3+LISTEN_FDS-1.
	Socknames []string
	Nonblock  []bool
	Pgid      int
	Pdeathsig int
	// ExtraWritten is set when the helper wrote "extra\n" to fd 3+LISTEN_FDS.
	ExtraWritten bool
	ExtraErr     string
}

// helperPrintEnv reports the contract as JSON on stdout. It only uses raw
// syscalls on the inherited fds: wrapping them in an *os.File or a
// net.Listener could change the shared O_NONBLOCK flag the test checks.
func helperPrintEnv() int {
	r := childReport{
		PID:           os.Getpid(),
		ListenFDs:     os.Getenv(EnvListenFDs),
		ListenPID:     os.Getenv(EnvListenPID),
		ListenFDNames: os.Getenv(EnvListenFDNames),
		NotifySocket:  os.Getenv(EnvNotifySocket),
	}
	n, _ := strconv.Atoi(r.ListenFDs)
	for fd := 3; fd < 3+n; fd++ {
		r.Socknames = append(r.Socknames, sockname(fd))
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		r.Nonblock = append(r.Nonblock, err == nil && flags&unix.O_NONBLOCK != 0)
	}
	r.Pgid, _ = unix.Getpgid(0)
	var sig int32
	if err := unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0); err == nil {
		r.Pdeathsig = int(sig)
	}
	if os.Getenv("WRITE_EXTRA") != "" {
		if _, err := unix.Write(3+n, []byte("extra\n")); err != nil {
			r.ExtraErr = err.Error()
		} else {
			r.ExtraWritten = true
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

func sockname(fd int) string {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "error: " + err.Error()
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	case *unix.SockaddrUnix:
		return a.Name
	}
	return fmt.Sprintf("%T", sa)
}

// helperNotifySend sends $NOTIFY_MESSAGE to $NOTIFY_SOCKET, as sd_notify does.
func helperNotifySend() int {
	addr := os.Getenv(EnvNotifySocket)
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	if _, err := c.Write([]byte(os.Getenv("NOTIFY_MESSAGE"))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// testBinary is the path of this test binary: the shim and the app.
func testBinary(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// fdCount counts the open descriptors of this process.
func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// shortDir returns a temporary directory with a short path (unix socket
// paths are limited to 108 bytes; t.TempDir can be longer).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
