package procunit

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a helper process (os/exec's pattern).
const helperEnv = "PROCUNIT_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "daemon":
		// Start a sleeper in a session of its own that keeps stdout, tell
		// its pid, and exit: a daemon left behind.
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=sleeper")
		cmd.Stdout = os.Stdout
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0)
	case "sleeper":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "clean":
		fmt.Println("done")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// gone reports whether pid has exited (no /proc entry, or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func modes(t *testing.T) []bool {
	if os.Geteuid() != 0 || ownCgroupDir() == "" {
		t.Logf("no cgroup v2 to make a folder in: the sweep alone")
		return []bool{true}
	}
	return []bool{false, true}
}

// startDaemon runs the helper that leaves a daemon behind (in a session of
// its own, keeping the helper's stdout) in a unit, and waits for the
// helper's end: the unit, the daemon's pid, and the output pipe, from the
// daemon's pid line on (closed at cleanup).
func startDaemon(t *testing.T) (*Unit, int, *bufio.Reader) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cmd, u, err := Start("test", func() *exec.Cmd {
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), helperEnv+"=daemon")
		c.Stdout = w
		return c
	})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(r)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("daemon's pid: %v", err)
	}
	daemon, _ := strconv.Atoi(strings.TrimSpace(line))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	return u, daemon, br
}

// A daemon that left the command's session and kept its stdout is listed
// when the command ends, and killed: the output pipe closes.
func TestDaemonLeftBehindIsKilled(t *testing.T) {
	for _, sweep := range modes(t) {
		t.Run(fmt.Sprintf("sweep=%v", sweep), func(t *testing.T) {
			noCgroup = sweep
			defer func() { noCgroup = false }()
			u, daemon, br := startDaemon(t)
			if want := map[bool]Mode{true: ModeSweep, false: ModeCgroup}[sweep]; u.Mode() != want {
				t.Fatalf("mode %q, want %q", u.Mode(), want)
			}
			if gone(daemon) {
				t.Fatalf("the daemon %d is not running", daemon)
			}
			// Has tells the unit's processes from any other (a reused pid).
			if !u.Has(daemon) || u.Has(os.Getpid()) || u.Has(os.Getppid()) {
				t.Errorf("Has: daemon %v, the test %v, its parent %v; want true, false, false",
					u.Has(daemon), u.Has(os.Getpid()), u.Has(os.Getppid()))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			left, err := u.End(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 1 || left[0].PID != daemon || !strings.Contains(left[0].String(), fmt.Sprintf("pid %d (", daemon)) {
				t.Errorf("left %v, want the daemon %d", left, daemon)
			}
			if !gone(daemon) {
				t.Errorf("the daemon %d still runs after End", daemon)
			}
			done := make(chan error, 1)
			go func() { _, err := io.ReadAll(br); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("read the output to its end: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("the output pipe is still open 10s after End")
			}
			if u.cg != nil {
				if _, err := os.Stat(u.cg.dir); !os.IsNotExist(err) {
					t.Errorf("cgroup %s not removed: %v", u.cg.dir, err)
				}
			}
		})
	}
}

// A command that leaves nothing behind ends with nothing left.
func TestCleanCommandLeavesNothing(t *testing.T) {
	for _, sweep := range modes(t) {
		noCgroup = sweep
		cmd, u, err := Start("test", func() *exec.Cmd {
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), helperEnv+"=clean")
			return c
		})
		noCgroup = false
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		left, err := u.End(ctx)
		cancel()
		if err != nil || len(left) != 0 {
			t.Errorf("sweep=%v: left %v, %v; want nothing", sweep, left, err)
		}
	}
}

// inFlight is the number of callers waiting on the read of pid's
// environment in flight, -1 when none is.
func inFlight(pid int) int {
	envMu.Lock()
	defer envMu.Unlock()
	if r, ok := envReads[pid]; ok {
		return r.readers
	}
	return -1
}

// Two sweeps that read one process's environment at once (two workers
// ending together) both get it: the second joins the read in flight and
// is never told the process is not a member because of the first.
func TestConcurrentEnvironmentReadsShareOne(t *testing.T) {
	release := make(chan struct{})
	var reads atomic.Int32
	readEnv = func(pid int) ([]byte, error) {
		if reads.Add(1) == 1 {
			<-release
		}
		return readEnviron(pid)
	}
	defer func() { readEnv = readEnviron }()
	pid := os.Getpid()
	type result struct {
		env []byte
		err error
	}
	results := make(chan result, 2)
	read := func() {
		env, err := readEnvironWithin(pid, 30*time.Second)
		results <- result{env, err}
	}
	go read()
	go read()
	for deadline := time.Now().Add(10 * time.Second); inFlight(pid) != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("the two reads are not both waiting on one read of %d's environment: %d", pid, inFlight(pid))
		}
	}
	close(release)
	for range 2 {
		r := <-results
		if r.err != nil || !bytes.Contains(r.env, []byte("PATH=")) {
			t.Errorf("a read of %d's environment beside another: %v (%d bytes)", pid, r.err, len(r.env))
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads of the environment for two callers at once, want 1", n)
	}
}

// A process whose environment cannot be read (its memory's lock held by a
// stuck kernel call) does not hold up a sweep: the read is given up after
// its bound, the unit's members are still found, and the next sweep does
// not wait on that process again.
func TestSweepDoesNotWaitOnAHungEnvironment(t *testing.T) {
	release := make(chan struct{})
	blocked := os.Getppid() // any live process outside the unit
	defer func() {
		// The hung read returns: the process is read again by later sweeps
		// (and by a next run of this test).
		close(release)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if inFlight(blocked) < 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the released read of %d's environment did not return", blocked)
			}
		}
	}()
	var blockedReads atomic.Int32
	readEnv = func(pid int) ([]byte, error) {
		if pid == blocked {
			blockedReads.Add(1)
			<-release
		}
		return readEnviron(pid)
	}
	defer func() { readEnv = readEnviron }()
	noCgroup = true
	defer func() { noCgroup = false }()
	u, daemon, _ := startDaemon(t)
	for i := range 2 {
		found := make(chan []int, 1)
		go func() { found <- u.sweep() }()
		select {
		case pids := <-found:
			if !slices.Contains(pids, daemon) {
				t.Fatalf("sweep %d: %v, want the daemon %d", i+1, pids, daemon)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("sweep %d still waits 30s on a process whose environment read hangs", i+1)
		}
	}
	// The second sweep skipped the process whose read still hangs.
	if n := blockedReads.Load(); n != 1 {
		t.Errorf("%d reads of the hung process's environment in 2 sweeps, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := u.End(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(daemon) {
		t.Errorf("the daemon %d still runs after End", daemon)
	}
}
