package workers

import (
	"bufio"
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

	"github.com/deployd/deployd/workers/logs"
)

func init() {
	// chatty-exit is ready; on SIGTERM it prints "chatty 0" .. "chatty
	// $LINES-1" and exits 0.
	helpers["chatty-exit"] = func() int {
		term := notifyTerm()
		n, _ := strconv.Atoi(os.Getenv("LINES"))
		if err := sdNotify("READY=1"); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		<-term
		// A write each: a line is written whole (a pipe takes up to
		// PIPE_BUF bytes at once), never split by the holder's lines.
		for i := range n {
			if _, err := fmt.Printf("chatty %d\n", i); err != nil {
				return 6
			}
		}
		return 0
	}
	// hold-stdout is a process outside any worker's unit that holds the
	// stdout of worker $HOLD_PID (opened through /proc, as one the worker
	// passed it to over SCM_RIGHTS would), says "holding" on its own
	// stdout, then writes a line into the worker's every 20 ms until it
	// cannot (the read end closed) or it is killed.
	helpers["hold-stdout"] = func() int {
		f, err := os.OpenFile("/proc/"+os.Getenv("HOLD_PID")+"/fd/1", os.O_WRONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 5
		}
		fmt.Println("holding")
		for i := 0; ; i++ {
			time.Sleep(20 * time.Millisecond)
			if _, err := fmt.Fprintf(f, "outsider %d\n", i); err != nil {
				return 0
			}
		}
	}
}

// holdStdout starts hold-stdout for worker pid, outside its unit (the
// test's own cgroup, no marker), and returns once it holds the worker's
// stdout. It is killed when the test ends.
func holdStdout(t *testing.T, pid int) {
	t.Helper()
	cmd := exec.Command(testBinary(t))
	cmd.Env = append(os.Environ(), helperEnv+"=hold-stdout", "HOLD_PID="+strconv.Itoa(pid), noRaceExitSleep)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		said <- line
	}()
	select {
	case line := <-said:
		if line != "holding\n" {
			t.Fatalf("the holder of worker %d's stdout said %q", pid, line)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("the holder of worker %d's stdout did not start", pid)
	}
}

// A process outside the worker's unit that holds its stdout (and writes
// into it) does not hold up the stop, and every line the worker wrote
// before it exited is in its log.
func TestStopNotHeldUpByAnotherHolderOfStdout(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "web.log")
	sink, err := logs.OpenSink(logs.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	const lines = 20000
	spec := testSpec(t, newListener(t), "chatty-exit", 1)
	spec.Env = append(spec.Env, "LINES="+strconv.Itoa(lines))
	s := New(Options{App: "web", Shim: testBinary(t), Out: sink}, spec)
	t.Cleanup(s.Stop)
	mustStart(t, s)
	w := currentWorkers(s)[0]
	holdStdout(t, w.PID)

	t0 := time.Now()
	s.Stop()
	took := time.Since(t0)
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop took %s", took.Round(time.Millisecond))
	// The worker exits at once on SIGTERM; its lines take a moment to read.
	if took > 2*time.Second {
		t.Errorf("Stop took %s with another process holding the worker's stdout; want it to end with the worker",
			took.Round(time.Millisecond))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]bool, lines)
	for _, l := range strings.Split(string(b), "\n") {
		_, num, ok := strings.Cut(l, "] chatty ")
		if n, err := strconv.Atoi(num); ok && err == nil && n >= 0 && n < lines {
			seen[n] = true
		}
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("line \"chatty %d\" of %d the worker wrote before it exited is not in its log", i, lines)
		}
	}
}

// envInPidNS marks the run of TestReapedWorkerPidIsNotKilled inside its
// own PID namespace.
const envInPidNS = "DEPLOYD_WORKERS_TEST_IN_PIDNS"

// After a worker is reaped, its pid may go to another process: a root
// process group that gets it must survive the worker's stop, while another
// process holds the worker's stdout open (which kept its drain, and so the
// stop, going until a SIGKILL to -pid at stop_timeout). In a PID namespace
// of its own, ns_last_pid makes the next process get the reaped pid.
func TestReapedWorkerPidIsNotKilled(t *testing.T) {
	if os.Getenv(envInPidNS) == "" {
		runInPidNS(t)
		return
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		t.Fatalf("mount the namespace's /proc: %v", err)
	}
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	spec.StopTimeout = time.Second
	s := newSupervisor(t, spec)
	mustStart(t, s)
	w := currentWorkers(s)[0]
	holdStdout(t, w.PID)

	t0 := time.Now()
	stopped := make(chan struct{})
	go func() { defer close(stopped); s.Stop() }()
	waitFor(t, "the worker to be reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(w.PID))
		return os.IsNotExist(err)
	})
	victim := victimGroup(t, w.PID)
	t.Logf("worker %d reaped %s after the stop began; process group %d got its pid",
		w.PID, time.Since(t0).Round(time.Millisecond), victim.pid)

	select {
	case <-stopped:
	case <-time.After(spec.StopTimeout + 3*time.Second):
		t.Errorf("Stop did not return within stop_timeout %s + 3s (another process holds the worker's stdout)",
			spec.StopTimeout)
	}
	w.killGroup() // as a kill after the worker's exit does (Discover)
	// A kill at stop_timeout would have come by now.
	victim.mustSurvive(t, time.Until(t0.Add(spec.StopTimeout+500*time.Millisecond)))
}

// runInPidNS runs the calling test again in a new PID and mount namespace
// (it needs root) and fails if it fails there.
func runInPidNS(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace needs root")
	}
	cmd := exec.Command(testBinary(t), "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envInPidNS+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { defer close(done); out, err = cmd.CombinedOutput() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the run in a PID namespace did not end within a minute:\n%s", out)
	}
	if err != nil {
		t.Fatalf("in a PID namespace: %v\n%s", err, out)
	}
	t.Logf("in a PID namespace:\n%s", out)
}

// victim is a process group that got a reaped worker's pid: its leader
// and a member, watched through pidfds.
type victim struct {
	pid   int
	procs []*os.Process
	fds   []int
}

// victimGroup starts a process that gets pid (free again: the worker that
// had it was reaped) by setting the namespace's ns_last_pid just before
// the fork, as the leader of a process group of its own, and a second
// process in that group. Both are killed when the test ends.
func victimGroup(t *testing.T, pid int) *victim {
	t.Helper()
	v := &victim{pid: pid}
	t.Cleanup(func() {
		for i, p := range v.procs {
			_ = unix.PidfdSendSignal(v.fds[i], unix.SIGKILL, nil, 0)
			_, _ = p.Wait()
			unix.Close(v.fds[i])
		}
	})
	attr := &os.ProcAttr{Env: append(os.Environ(), helperEnv+"=hang", noRaceExitSleep),
		Files: []*os.File{nil, os.Stdout, os.Stderr}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
		t.Fatalf("set ns_last_pid: %v", err)
	}
	leader, err := os.StartProcess(testBinary(t), []string{testBinary(t)}, attr)
	if err != nil {
		t.Fatal(err)
	}
	v.add(t, leader)
	if leader.Pid != pid {
		t.Fatalf("the victim got pid %d, not the worker's %d (another process took it first)", leader.Pid, pid)
	}
	attr.Sys = &syscall.SysProcAttr{Setpgid: true, Pgid: pid}
	member, err := os.StartProcess(testBinary(t), []string{testBinary(t)}, attr)
	if err != nil {
		t.Fatal(err)
	}
	v.add(t, member)
	return v
}

func (v *victim) add(t *testing.T, p *os.Process) {
	t.Helper()
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		_ = p.Kill()
		_, _ = p.Wait()
		t.Fatal(err)
	}
	v.procs, v.fds = append(v.procs, p), append(v.fds, fd)
}

// mustSurvive fails the test if the victim's leader or member dies within d.
func (v *victim) mustSurvive(t *testing.T, d time.Duration) {
	t.Helper()
	pfds := make([]unix.PollFd, len(v.fds))
	for i, fd := range v.fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	deadline := time.Now().Add(d)
	for {
		n, err := unix.Poll(pfds, int(max(time.Until(deadline).Milliseconds(), 0)))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range pfds {
			if n > 0 && p.Revents != 0 {
				st, _ := v.procs[i].Wait()
				t.Fatalf("process %d of the process group %d that got the reaped worker's pid died: %v",
					v.procs[i].Pid, v.pid, st)
			}
		}
		return
	}
}
