package workers

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A worker's output pipes reach EOF when every process holding a write end
// has closed it. Once the worker has exited and its unit is empty, no
// process of the worker's holds one; one that still does is outside it (a
// process the worker passed its stdout to over SCM_RIGHTS), and may hold
// it for ever. So, as os/exec's Cmd.WaitDelay bounds the wait for a
// command's pipes, the drain does not wait for EOF: every byte the worker
// wrote was in a pipe when its unit was emptied, and a pipe is first in,
// first out, so once a pipe was seen empty after that, the readers have
// read all of the worker's bytes; its read end is then closed, which ends
// the reader's blocked read after it delivered what it read. A pipe that
// is never seen empty (a writer outside outpaces the reader) is cut after
// outputMax.

// outputPoll is how often drainOutput looks whether a channel is empty,
// and outputMax how long it waits in all.
const (
	outputPoll = 5 * time.Millisecond
	outputMax  = 10 * time.Second
)

// drainOutput waits until the readers of the worker's channels (chans:
// output pipes, node-ipc and preload channels) have read everything the
// worker wrote, then closes ends (chans and the journals). Call it once
// nothing of the worker's unit runs.
func (w *Worker) drainOutput(readers *sync.WaitGroup, chans, ends []*os.File) {
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	tick := time.NewTicker(outputPoll)
	defer tick.Stop()
	limit := time.NewTimer(outputMax)
	defer limit.Stop()
	seenEmpty := make([]bool, len(chans))
	for wait := true; wait; {
		select {
		case <-drained:
			wait = false
			continue
		case <-tick.C:
			if !allSeenEmpty(chans, seenEmpty) {
				continue
			}
		case <-limit.C:
		}
		// Closing the read ends ends the readers' blocked reads; the
		// journals stay open until the readers have delivered.
		w.pz.seal()
		closeFiles(chans...)
		<-drained
		wait = false
	}
	// The readers leave their ends to this, and a handoff that passes
	// them on (this worker died during it) holds them: closed earlier,
	// the next agent would get closed or reused fds; once sealed, no
	// handoff takes them.
	w.pz.seal()
	closeFiles(ends...)
}

// allSeenEmpty marks in seen each of chans that holds no unread byte now
// (FIONREAD; a closed one counts as empty) and reports whether all were
// seen empty at least once.
func allSeenEmpty(chans []*os.File, seen []bool) bool {
	all := true
	for i, f := range chans {
		if !seen[i] {
			seen[i] = unreadBytes(f) == 0
		}
		all = all && seen[i]
	}
	return all
}

// unreadBytes is the number of bytes waiting in pipe or stream socket f
// (FIONREAD), 0 when it cannot be asked (closed).
func unreadBytes(f *os.File) int {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	cerr := raw.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	if cerr != nil || err != nil {
		return 0
	}
	return n
}
