package workers

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// Counters are an app's event counts since its Supervisor was created, for
// metrics. They only grow.
type Counters struct {
	// Restarts counts workers started again after they exited on their own.
	Restarts uint64
	// Reloads counts finished reloads (reload, deploy, rollback) by outcome:
	// "done", "abandoned" (the new version never got ready) or "failed".
	Reloads map[string]uint64
	// ReloadSeconds is the summed duration of the reloads counted in Reloads.
	ReloadSeconds float64
	// ReloadBuckets[i] counts the reloads that took at most
	// ReloadBucketBounds()[i] seconds (a cumulative histogram).
	ReloadBuckets []uint64
}

// reloadBounds are the upper bounds, in seconds, of Counters.ReloadBuckets.
var reloadBounds = [...]float64{0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// ReloadBucketBounds returns the upper bounds, in seconds, of Counters.ReloadBuckets.
func ReloadBucketBounds() []float64 { return slices.Clone(reloadBounds[:]) }

// Reload outcomes in Counters.Reloads.
const (
	ReloadDone      = "done"
	ReloadAbandoned = "abandoned"
	ReloadFailed    = "failed"
)

// counters is a Supervisor's Counters; safe for concurrent use.
type counters struct {
	mu sync.Mutex
	c  Counters
}

func (c *counters) restarted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c.Restarts++
}

// reloaded counts a reload that took d and ended with err.
func (c *counters) reloaded(d time.Duration, err error) {
	outcome := ReloadDone
	var ab *AbandonedError
	switch {
	case errors.As(err, &ab):
		outcome = ReloadAbandoned
	case err != nil:
		outcome = ReloadFailed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c.Reloads == nil {
		c.c.Reloads = map[string]uint64{}
	}
	c.c.Reloads[outcome]++
	c.c.ReloadSeconds += d.Seconds()
	if c.c.ReloadBuckets == nil {
		c.c.ReloadBuckets = make([]uint64, len(reloadBounds))
	}
	for i, le := range reloadBounds {
		if d.Seconds() <= le {
			c.c.ReloadBuckets[i]++
		}
	}
}

// Counters returns a copy of the app's event counts.
func (s *Supervisor) Counters() Counters {
	s.ctr.mu.Lock()
	defer s.ctr.mu.Unlock()
	c := s.ctr.c
	c.Reloads = map[string]uint64{ReloadDone: 0, ReloadAbandoned: 0, ReloadFailed: 0}
	for k, v := range s.ctr.c.Reloads {
		c.Reloads[k] = v
	}
	c.ReloadBuckets = make([]uint64, len(reloadBounds))
	copy(c.ReloadBuckets, s.ctr.c.ReloadBuckets)
	return c
}
