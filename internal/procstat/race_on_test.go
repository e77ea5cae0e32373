//go:build race

package procstat

// raceEnabled: the race detector's instrumentation changes what escapes to
// the heap, so allocation counts do not hold under it.
const raceEnabled = true
