package workers

import (
	"slices"
	"time"
)

// monitorInterval is how often max_memory and the watchdog are checked.
const monitorInterval = time.Second

// ensureMonitor starts the monitor goroutine once, when the spec asks for
// max_memory or a watchdog.
func (s *Supervisor) ensureMonitor() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.monitoring || s.closed || (s.spec.MaxMemory <= 0 && s.spec.Watchdog <= 0) {
		return
	}
	s.monitoring = true
	s.wg.Add(1)
	go s.monitor()
}

// monitor replaces, the graceful way (new worker ready first), a worker
// whose RSS passed max_memory or that stopped sending WATCHDOG=1.
func (s *Supervisor) monitor() {
	defer s.wg.Done()
	t := time.NewTicker(monitorInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		for _, c := range s.overLimit() {
			s.replaceOne(c)
		}
	}
}

type overLimit struct {
	sl  *slot
	w   *Worker
	why string
}

// overLimit lists ready workers over max_memory or past their watchdog.
func (s *Supervisor) overLimit() []overLimit {
	s.mu.Lock()
	type cand struct {
		sl   *slot
		w    *Worker
		spec *Spec
	}
	var cs []cand
	for _, sl := range s.slots {
		if sl.cur != nil {
			cs = append(cs, cand{sl, sl.cur, sl.spec})
		}
	}
	s.mu.Unlock()
	var out []overLimit
	now := time.Now()
	for _, c := range cs {
		if c.w.State() != Ready {
			continue
		}
		if c.spec.MaxMemory > 0 {
			if u := c.w.usage(s.fs); u.RSSBytes > c.spec.MaxMemory {
				out = append(out, overLimit{c.sl, c.w, "max_memory"})
				s.log.Warn("worker over max_memory; replacing it", "worker", c.sl.index, "pid", c.w.PID,
					"rss", u.RSSBytes, "max_memory", c.spec.MaxMemory)
				continue
			}
		}
		if c.spec.Watchdog > 0 {
			c.w.mu.Lock()
			last := c.w.watchdog
			if last.IsZero() {
				last = c.w.readyAt
			}
			c.w.mu.Unlock()
			if now.Sub(last) > c.spec.Watchdog {
				out = append(out, overLimit{c.sl, c.w, "watchdog"})
				s.log.Warn("worker missed its watchdog; replacing it", "worker", c.sl.index, "pid", c.w.PID,
					"silent_for", now.Sub(last).Round(time.Millisecond), "watchdog", c.spec.Watchdog)
			}
		}
	}
	return out
}

// replaceOne replaces sl's worker with a new one on the same spec, ready
// first. Skipped when another operation runs (the next check retries).
func (s *Supervisor) replaceOne(c overLimit) {
	sl, why := c.sl, c.why
	if !s.op.TryLock() {
		return
	}
	defer s.op.Unlock()
	// The slot may have gone (scale, stop) or changed worker since the check.
	s.mu.Lock()
	ok := !s.closed && s.state != AppStopped && slices.Contains(s.slots, sl) && sl.cur == c.w
	spec := sl.spec
	s.mu.Unlock()
	if !ok {
		return
	}
	if err := s.replaceGroup([]*slot{sl}, spec, s.emitter(nil), why); err != nil {
		s.log.Error("replacement did not get ready; the old worker stays", "worker", sl.index, "reason", why, "error", err)
		return
	}
	s.mu.Lock()
	switch why {
	case "max_memory":
		sl.memoryReplacements++
	case "watchdog":
		sl.watchdogReplacements++
	}
	s.mu.Unlock()
}
