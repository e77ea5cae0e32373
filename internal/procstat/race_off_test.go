//go:build !race

package procstat

const raceEnabled = false
