package workers

import (
	"errors"
	"maps"
	"os"
	"sync"
	"time"
)

// deadliner is a channel end the agent reads (pipe, socket) whose blocked
// read a deadline ends: how its reader is paused.
type deadliner interface{ SetReadDeadline(time.Time) error }

// pauser lets the agent pause every reader of one worker's channels (output
// pipes, notify socket, node channels) for a handoff: each reader parks
// with the start of the line it holds, so that the next agent, reading the
// same channel from the same place, neither loses nor repeats a byte. After
// a failed handoff the readers resume; after a successful one they end
// without touching the channel. Safe for concurrent use.
type pauser struct {
	mu       sync.Mutex
	cond     *sync.Cond
	paused   bool
	released bool
	sealed   bool          // the worker's ends are closing (seal)
	resumeCh chan struct{} // closed by resume or release
	active   int           // readers reading (not parked, not ended)
	pending  map[string][]byte
	files    []deadliner
}

func newPauser(pending map[string][]byte) *pauser {
	p := &pauser{pending: maps.Clone(pending)}
	if p.pending == nil {
		p.pending = map[string][]byte{}
	}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// add registers a reader of f; call it before the reader's goroutine starts.
func (p *pauser) add(f deadliner) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.files = append(p.files, f)
	p.active++
}

// run is a reader's loop: read (which gets the pending start of a line and
// returns what it holds when its read deadline passes) until it ends for
// another reason or the pauser is released.
func (p *pauser) run(name string, read func(pending []byte) ([]byte, error)) {
	p.mu.Lock()
	pending := p.pending[name]
	delete(p.pending, name)
	p.mu.Unlock()
	for {
		rest, err := read(pending)
		pending = rest
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			p.mu.Lock()
			p.active--
			p.cond.Broadcast()
			p.mu.Unlock()
			return
		}
		if !p.park(name, rest) {
			return
		}
	}
}

// park holds a paused reader until resume (true) or release (false).
func (p *pauser) park(name string, rest []byte) bool {
	p.mu.Lock()
	if !p.paused { // a deadline nobody asked for: read on
		p.mu.Unlock()
		return true
	}
	p.pending[name] = rest
	p.active--
	p.cond.Broadcast()
	ch := p.resumeCh
	p.mu.Unlock()
	<-ch
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return false
	}
	delete(p.pending, name)
	p.active++
	return true
}

// pause stops every reader at a read and returns the partial line each
// holds, by reader name. Bytes not read yet stay in the channels. It
// reports false, doing nothing, once the worker's ends are closing (seal).
func (p *pauser) pause() (map[string][]byte, bool) {
	p.mu.Lock()
	if p.sealed {
		p.mu.Unlock()
		return nil, false
	}
	if p.paused || p.released {
		out := maps.Clone(p.pending)
		p.mu.Unlock()
		return out, true
	}
	p.paused, p.resumeCh = true, make(chan struct{})
	files := p.files
	p.mu.Unlock()
	for _, f := range files {
		_ = f.SetReadDeadline(time.Unix(1, 0))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.active > 0 {
		p.cond.Wait()
	}
	return maps.Clone(p.pending), true
}

// seal waits until no handoff holds the channels (between pause and
// resume or release: their ends are being passed to the next agent, which
// must get them open), then marks them closing: a later pause reports
// false, so that a worker whose waiter closes its ends is not handed over.
// The worker's waiter calls it before it closes them.
func (p *pauser) seal() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.paused && !p.released {
		ch := p.resumeCh
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
	p.sealed = true
}

// resume lets the readers read on (a handoff failed).
func (p *pauser) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused || p.released {
		return
	}
	for _, f := range p.files {
		_ = f.SetReadDeadline(time.Time{})
	}
	p.paused = false
	close(p.resumeCh)
}

// release ends the parked readers for good (the next agent reads now).
func (p *pauser) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused || p.released {
		return
	}
	p.released = true
	close(p.resumeCh)
}
