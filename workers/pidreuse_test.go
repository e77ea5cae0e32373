package workers

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/pidns"
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

// After a worker is reaped, its pid may go to another process: a root
// process group that gets it must survive the worker's stop, while another
// process holds the worker's stdout open (which kept its drain, and so the
// stop, going until a SIGKILL to -pid at stop_timeout). In a PID namespace
// of its own, ns_last_pid makes the next process get the reaped pid.
func TestReapedWorkerPidIsNotKilled(t *testing.T) {
	if !pidns.Enter(t) {
		return
	}
	for try := 1; !reapedPidSurvives(t); try++ {
		if try == 3 {
			t.Fatal("another process took the reaped pid first, three times")
		}
	}
}

// reapedPidSurvives stops a worker whose stdout another process holds, gives
// its pid to a new process group once it is reaped, and checks that the
// group survives and the stop ends in time. It returns false when the pid
// went to another process first.
func reapedPidSurvives(t *testing.T) bool {
	spec := testSpec(t, newListener(t), "serve-ready", 1)
	spec.StopTimeout = time.Second
	s := newSupervisor(t, spec)
	mustStart(t, s)
	w := currentWorkers(s)[0]
	holdStdout(t, w.PID)

	t0 := time.Now()
	stopped := make(chan struct{})
	go func() { defer close(stopped); s.Stop() }()
	defer func() { <-stopped }()
	waitFor(t, "the worker to be reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(w.PID))
		return os.IsNotExist(err)
	})
	victim := pidns.NewVictim(t, w.PID)
	if victim == nil {
		return false
	}
	t.Logf("worker %d reaped %s after the stop began; process group %d got its pid",
		w.PID, time.Since(t0).Round(time.Millisecond), victim.PID)

	select {
	case <-stopped:
	case <-time.After(spec.StopTimeout + 3*time.Second):
		t.Errorf("Stop did not return within stop_timeout %s + 3s (another process holds the worker's stdout)",
			spec.StopTimeout)
	}
	w.killGroup() // as a kill after the worker's exit does (Discover)
	// A kill at stop_timeout would have come by now.
	victim.MustSurvive(t, time.Until(t0.Add(spec.StopTimeout+500*time.Millisecond)))
	return true
}
