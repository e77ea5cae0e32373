package handoff

import (
	"io"
	"os"
	"testing"
)

// A worker started with Keep holds the agent's read end of its own output
// pipe at KeepFD: once the agent's copies are gone (a SIGKILL), what the
// worker wrote waits in the pipe, and GetFd copies the read end back out.
func TestKeptPipeReadEndIsTakenBack(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	size, err := EnlargePipe(w)
	if err != nil || size < 64<<10 {
		t.Fatalf("EnlargePipe = %d, %v; want at least the default 64 KiB", size, err)
	}
	t.Logf("pipe raised to %d bytes", size)
	proc, err := Start(Proc{Argv: []string{"sleep", "30"}, Exec: "/bin/sleep", Direct: true,
		Stdout: w, Stderr: w, Keep: []*os.File{r}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = proc.Kill(); _, _ = proc.Wait() }()
	start, err := StartTime(proc.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Output written while the agent is gone: the agent's ends close.
	if _, err := w.Write([]byte("line 1\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r.Close()

	p, err := OpenPidfd(proc.Pid, start)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, err := p.GetFd(1, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if IsPipeReadEnd(out) {
		t.Errorf("fd 1 of the worker (a write end) is taken for a read end")
	}
	out.Close()
	got, err := p.GetFd(KeepFD, "out")
	if err != nil {
		t.Fatalf("GetFd(KeepFD): %v", err)
	}
	defer got.Close()
	if !IsPipeReadEnd(got) {
		t.Fatalf("fd %d of the worker is not the read end of its pipe", KeepFD)
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "line 1\n" {
		t.Fatalf("read from the taken-back read end: %q, %v", buf, err)
	}
}
