package handoff

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPidfdChecksStartTimeAndWatchesExit(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// A reused pid has another start time: never adopted.
	if _, err := OpenPidfd(cmd.Process.Pid, start+1); !errors.Is(err, ErrNotSameProcess) {
		t.Fatalf("OpenPidfd with another start time: %v, want ErrNotSameProcess", err)
	}
	p, err := OpenPidfd(cmd.Process.Pid, start)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !Running(cmd.Process.Pid, start) {
		t.Fatal("Running = false for a live process")
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case <-done:
		t.Fatal("Wait returned while the process runs")
	case <-time.After(50 * time.Millisecond):
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after the process exited")
	}
	// Not reaped yet: a zombie is not running.
	if Running(cmd.Process.Pid, start) {
		t.Error("Running = true for a zombie")
	}
	cmd.Wait()
}

func TestParcelsCarryFilesInOrder(t *testing.T) {
	mine, theirs, err := NewHandoverChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	go func() {
		_ = SendParcels(mine, []Parcel{{Header: []byte("hdr")}, {Header: []byte("w1"), Files: []*os.File{r, w}}},
			time.Now().Add(5*time.Second))
	}()
	ps, err := ReceiveParcels(theirs, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || string(ps[0].Header) != "hdr" || string(ps[1].Header) != "w1" || len(ps[1].Files) != 2 {
		t.Fatalf("received %d parcels: %+v", len(ps), ps)
	}
	// The received write end writes into the same pipe.
	if _, err := ps[1].Files[1].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := r.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
	for _, f := range ps[1].Files {
		f.Close()
	}
}

// threads is the number of OS threads of the test process.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// WaitChild keeps p.Wait's report (exit code, signal, rusage, pid) and
// blocks no OS thread while the children run: with one thread per waiting
// child, n children would add about n threads.
func TestWaitChildReportsExitWithoutAThreadEach(t *testing.T) {
	const n = 16
	type result struct {
		st  *os.ProcessState
		err error
		at  time.Time
	}
	before := threads(t)
	cmds := make([]*exec.Cmd, n)
	stdins := make([]io.WriteCloser, n)
	results := make([]chan result, n)
	for i := range cmds {
		// Exits with 7 when its stdin closes (at the latest when the test ends).
		cmds[i] = exec.Command("sh", "-c", "read _; exit 7")
		in, err := cmds[i].StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdins[i] = in
		defer in.Close()
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		defer cmds[i].Process.Kill()
		results[i] = make(chan result, 1)
		go func(p *os.Process, c chan<- result) {
			st, err := WaitChild(p)
			c <- result{st, err, time.Now()}
		}(cmds[i].Process, results[i])
	}
	// A thread blocked in waitid per child shows within milliseconds (the
	// runtime hands the P to a new thread): watch for a second.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got := threads(t); got >= before+n/2 {
			t.Fatalf("%d threads while %d children are waited for, %d before: a thread blocks per wait", got, n, before)
		}
	}
	for i := range results {
		select {
		case r := <-results[i]:
			t.Fatalf("child %d: WaitChild returned while it runs: %v %v", i, r.st, r.err)
		default:
		}
	}
	// Half exit with a status, half are killed.
	for i := range cmds {
		start := time.Now()
		want := "exit status 7"
		if i%2 == 0 {
			stdins[i].Close()
		} else {
			want = "signal: killed"
			if err := syscall.Kill(cmds[i].Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		var r result
		select {
		case r = <-results[i]:
		case <-time.After(5 * time.Second):
			t.Fatalf("child %d: WaitChild did not return within 5s of its exit", i)
		}
		if r.err != nil {
			t.Fatalf("child %d: %v", i, r.err)
		}
		if r.st.String() != want || r.st.Pid() != cmds[i].Process.Pid || !r.st.Exited() == (i%2 == 0) {
			t.Errorf("child %d (pid %d): %q pid %d exited=%v, want %q", i, cmds[i].Process.Pid, r.st, r.st.Pid(), r.st.Exited(), want)
		}
		if ru, ok := r.st.SysUsage().(*syscall.Rusage); !ok || ru == nil || ru.Maxrss == 0 {
			t.Errorf("child %d: no rusage: %#v", i, r.st.SysUsage())
		}
		t.Logf("child %d: %s, reaped %v after its end was asked", i, r.st, r.at.Sub(start).Round(time.Microsecond))
	}
}
