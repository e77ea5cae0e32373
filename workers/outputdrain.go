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
// is never seen empty (a writer outside outpaces the reader) is cut once
// its reader no longer gains on it for outputStall, or after outputMax.

// outputPoll is how often drainOutput looks whether a channel is empty;
// outputStall is how long it waits while no reader moves on (no channel
// not yet seen empty holds fewer unread bytes than it ever did), and
// outputMax how long it waits in all. A reader into the systemd journal
// takes a few thousand lines a second, so a worker that exits with its
// 1 MiB pipe full (handoff.PipeSize) is read to the end for tens of
// seconds; cut at a fixed 10 s, the rest of it was lost, the line read
// last cut in two (a replaced worker in TestRealSystemdBothEveryLineOnce).
const (
	outputPoll  = 5 * time.Millisecond
	outputStall = 10 * time.Second
	outputMax   = 2 * time.Minute
)

// drainOutput waits until the readers of the worker's channels (chans:
// output pipes, node-ipc and preload channels) have read everything the
// worker wrote, then closes ends (chans and the journals). Call it once
// nothing of the worker's unit runs.
func (w *Worker) drainOutput(readers *sync.WaitGroup, chans, ends []*os.File) {
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	if !awaitRead(drained, chans, outputStall, outputMax) {
		// Closing the read ends ends the readers' blocked reads; the
		// journals stay open until the readers have delivered.
		w.pz.seal()
		closeFiles(chans...)
		<-drained
	}
	// The readers leave their ends to this, and a handoff that passes
	// them on (this worker died during it) holds them: closed earlier,
	// the next agent would get closed or reused fds; once sealed, no
	// handoff takes them.
	w.pz.seal()
	closeFiles(ends...)
}

// awaitRead waits until drained is closed (true: the readers ended), or
// (false) until every one of chans was seen empty, no reader moved on for
// stall, or max passed.
func awaitRead(drained <-chan struct{}, chans []*os.File, stall, max time.Duration) bool {
	tick := time.NewTicker(outputPoll)
	defer tick.Stop()
	moving := time.NewTimer(stall)
	defer moving.Stop()
	limit := time.NewTimer(max)
	defer limit.Stop()
	seenEmpty := make([]bool, len(chans))
	least := make([]int, len(chans)) // the fewest unread bytes seen in each
	for {
		select {
		case <-drained:
			return true
		case <-tick.C:
			all, moved := scanChans(chans, seenEmpty, least)
			if moved {
				moving.Reset(stall)
			}
			if all {
				return false
			}
		case <-moving.C:
			return false
		case <-limit.C:
			return false
		}
	}
}

// scanChans marks in seen each of chans that holds no unread byte now
// (FIONREAD; a closed one counts as empty) and reports whether all were
// seen empty at least once, and whether one not seen empty yet holds
// fewer unread bytes than least tells (its reader moved on; least is
// updated).
func scanChans(chans []*os.File, seen []bool, least []int) (all, moved bool) {
	all = true
	for i, f := range chans {
		if !seen[i] {
			n := unreadBytes(f)
			seen[i] = n == 0
			if n > 0 && (least[i] == 0 || n < least[i]) {
				least[i], moved = n, true
			}
		}
		all = all && seen[i]
	}
	return all, moved
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
