package workers

import (
	"os"
	"testing"
	"time"

	"github.com/deployd/deployd/handoff"
)

// fullPipe is a pipe of handoff.PipeSize holding n bytes, whose writer is
// closed unless keep.
func fullPipe(t *testing.T, n int, keep bool) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	if _, err := handoff.EnlargePipe(w); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if !keep {
		w.Close()
	}
	return r, w
}

// A reader slower than the stall bound (as one into the systemd journal
// is) but moving on is waited for until its pipe is empty: the worker's
// last lines are all read, none cut off.
func TestAwaitReadWaitsForASlowReader(t *testing.T) {
	const size, step = 512 << 10, 32 << 10
	r, _ := fullPipe(t, size, false)
	go func() { // 16 steps of 20 ms: 320 ms, more than the stall bound
		b := make([]byte, step)
		for {
			if _, err := r.Read(b); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond) // the reader's pace, not a wait for a condition
		}
	}()
	never := make(chan struct{})
	if awaitRead(never, []*os.File{r}, 100*time.Millisecond, time.Minute) {
		t.Fatal("awaitRead: the readers ended?")
	}
	if n := unreadBytes(r); n != 0 {
		t.Fatalf("awaitRead returned with %d of %d bytes unread: the rest would be cut off", n, size)
	}
}

// A pipe no reader takes from (or a writer outside keeps full) is cut
// after the stall bound, not waited for until the overall bound.
func TestAwaitReadCutsAPipeThatDoesNotMove(t *testing.T) {
	r, _ := fullPipe(t, 64<<10, true)
	never := make(chan struct{})
	start := time.Now()
	if awaitRead(never, []*os.File{r}, 100*time.Millisecond, time.Minute) {
		t.Fatal("awaitRead: the readers ended?")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("awaitRead waited %s for a pipe that did not move", d)
	}
}
