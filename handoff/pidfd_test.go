package handoff

import (
	"errors"
	"os"
	"os/exec"
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
