package logs

import "sync"

// lineQueue is a Sink's bounded queue of lines. Unlike a buffered channel of
// BufferLines it holds memory only for the lines queued: an idle sink keeps
// a small slice, and the big one a burst needed is let go once the traffic
// falls (a channel of 10 000 Lines is 880 KB per file, 3.5 MB for two apps'
// out and err, live for the agent's whole life and doubling its GC target).
// Safe for concurrent use.
type lineQueue struct {
	max   int           // lines queued at most
	ready chan struct{} // holds a token while lines wait for the writer

	mu    sync.Mutex
	lines []Line // oldest first
	spare []Line // the writer's last batch, emptied, for reuse
	peak  int    // recent batch sizes: the largest, decaying by 1/64 per batch
}

// keepLines is the capacity of a batch the writer keeps for reuse in any
// case; a bigger one is kept while recent batches fill a quarter of it.
const keepLines = 256

func newLineQueue(max int) *lineQueue {
	return &lineQueue{max: max, ready: make(chan struct{}, 1)}
}

// push queues l; false when the queue is full.
func (q *lineQueue) push(l Line) bool {
	q.mu.Lock()
	if len(q.lines) >= q.max {
		q.mu.Unlock()
		return false
	}
	if q.lines == nil {
		q.lines = make([]Line, 0, keepLines)
	}
	q.lines = append(q.lines, l)
	first := len(q.lines) == 1
	q.mu.Unlock()
	if first { // the writer takes every line at once, so one token per batch is enough
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// take removes and returns every queued line (nil when there is none). The
// caller hands the slice back with done when it has written the lines.
func (q *lineQueue) take() []Line {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.lines) == 0 {
		return nil
	}
	b := q.lines
	q.lines, q.spare = q.spare, nil
	return b
}

// done gives back a batch from take once its lines are written: its strings
// are let go, and its array is kept for the next batch unless it is big and
// recent batches were much smaller (the burst that grew it is over).
func (q *lineQueue) done(b []Line) {
	clear(b)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.peak = max(len(b), q.peak-q.peak/64)
	if cap(b) > keepLines && cap(b) > 4*q.peak {
		return
	}
	if q.spare == nil && q.lines == nil {
		q.lines = b[:0]
	} else if q.spare == nil {
		q.spare = b[:0]
	}
}

// trim lets go of arrays bigger than keepLines that hold no line; it
// reports whether there was one.
func (q *lineQueue) trim() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	big := false
	if cap(q.spare) > keepLines {
		q.spare, big = nil, true
	}
	if len(q.lines) == 0 && cap(q.lines) > keepLines {
		q.lines, big = nil, true
	}
	q.peak = 0
	return big
}

// len is the number of queued lines.
func (q *lineQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.lines)
}
