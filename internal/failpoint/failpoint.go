// Package failpoint holds the test-only knobs that shift the timing of
// faults on purpose, so that a stress run (.ci/stress) finds the races a
// quiet machine hides. Each is read from the environment once and does
// nothing when unset; nothing in a normal run sets them.
package failpoint

import (
	"math/rand/v2"
	"os"
	"sync"
	"time"
)

// EnvHandoffHold: a new agent taking over from a previous one waits this
// long (a Go duration, at most 30 s) between being ready and telling the
// previous agent, so that a test can SIGKILL either agent in the middle of
// a handoff that otherwise takes milliseconds. "before:D" waits before
// telling systemd its pid instead (the previous agent is then still
// systemd's main pid). Read by the agent (upgrade.go).
const EnvHandoffHold = "DEPLOYD_TEST_HANDOFF_HOLD"

// EnvSignalDelay holds every signal the agent receives (SIGHUP, SIGTERM,
// SIGUSR1) and every stop signal it sends a worker for a random time in
// [0, D], D a Go duration of at most MaxSignalDelay: a signal that arrives
// late, as on a loaded machine.
const EnvSignalDelay = "DEPLOYD_TEST_SIGNAL_DELAY"

// MaxSignalDelay bounds EnvSignalDelay.
const MaxSignalDelay = 5 * time.Second

// signalDelay is EnvSignalDelay's D, 0 when unset or not a positive duration.
var signalDelay = sync.OnceValue(func() time.Duration {
	d, err := time.ParseDuration(os.Getenv(EnvSignalDelay))
	if err != nil || d <= 0 {
		return 0
	}
	return min(d, MaxSignalDelay)
})

// SignalDelay reports EnvSignalDelay's bound; 0: signals are not delayed.
func SignalDelay() time.Duration { return signalDelay() }

// DelaySignal waits a random time in [0, SignalDelay()]: at once when the
// knob is unset.
func DelaySignal() {
	if d := signalDelay(); d > 0 {
		time.Sleep(rand.N(d + 1))
	}
}

// EnvSweepHold: the exit sweep of a worker whose escaped processes (a
// setsid daemon holding the app's listener, workers/sweep.go) got its stop
// signal waits this long (a Go duration, at most MaxSweepHold) after it
// took them over and before it kills them: a sweep slowed by a loaded
// machine, so that a test sees what waits for it and what does not.
// Read by the agent (workers).
const EnvSweepHold = "DEPLOYD_TEST_SWEEP_HOLD"

// MaxSweepHold bounds EnvSweepHold.
const MaxSweepHold = 10 * time.Second

// sweepHold is EnvSweepHold's duration, 0 when unset or not positive.
var sweepHold = sync.OnceValue(func() time.Duration {
	d, err := time.ParseDuration(os.Getenv(EnvSweepHold))
	if err != nil || d <= 0 {
		return 0
	}
	return min(d, MaxSweepHold)
})

// HoldSweep waits EnvSweepHold's duration: at once when the knob is unset.
func HoldSweep() {
	if d := sweepHold(); d > 0 {
		time.Sleep(d)
	}
}
