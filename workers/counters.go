package workers

import (
	"errors"
	"maps"
	"slices"
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
	// DroppedEvents counts events a subscriber lost because it fell behind.
	DroppedEvents uint64
	// HealthCheckFailures counts the failed liveness checks ([apps.NAME.health])
	// of every worker the app had, replaced ones too.
	HealthCheckFailures uint64
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

// reloaded counts a reload that took d and ended with err. Owned by the loop.
func (c *Counters) reloaded(d time.Duration, err error) {
	outcome := ReloadDone
	var ab *AbandonedError
	switch {
	case errors.As(err, &ab):
		outcome = ReloadAbandoned
	case err != nil:
		outcome = ReloadFailed
	}
	if c.Reloads == nil {
		c.Reloads = map[string]uint64{}
	}
	c.Reloads[outcome]++
	c.ReloadSeconds += d.Seconds()
	if c.ReloadBuckets == nil {
		c.ReloadBuckets = make([]uint64, len(reloadBounds))
	}
	for i, le := range reloadBounds {
		if d.Seconds() <= le {
			c.ReloadBuckets[i]++
		}
	}
}

// Counters returns a copy of the app's event counts.
func (s *Supervisor) Counters() Counters {
	var c Counters
	s.read(func(st *state) {
		c = st.ctr
		c.Reloads = map[string]uint64{ReloadDone: 0, ReloadAbandoned: 0, ReloadFailed: 0}
		maps.Copy(c.Reloads, st.ctr.Reloads)
		c.ReloadBuckets = make([]uint64, len(reloadBounds))
		copy(c.ReloadBuckets, st.ctr.ReloadBuckets)
	})
	c.HealthCheckFailures = s.healthFailed.Load()
	return c
}
