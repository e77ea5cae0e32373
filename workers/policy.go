package workers

import (
	"regexp"
	"time"
)

// ReadyMode is how a worker tells it is ready.
type ReadyMode string

// Ready modes.
const (
	ReadyNotify  ReadyMode = "notify"   // READY=1 on NOTIFY_SOCKET
	ReadyNodeIPC ReadyMode = "node-ipc" // process.send('ready') on NODE_CHANNEL_FD
	ReadyLog     ReadyMode = "log"      // an output line matches Regex
	ReadyDelay   ReadyMode = "delay"    // alive for Delay
)

// ReadyPolicy is the readiness policy of a spec.
type ReadyPolicy struct {
	Mode  ReadyMode
	Regex *regexp.Regexp // ReadyLog
	Delay time.Duration  // ReadyDelay
}

// RestartPolicy is the crash-restart policy of a spec: exponential backoff
// from Backoff to MaxBackoff (jittered), reset after a worker stayed up
// StableAfter; more than MaxRestarts crashes of one slot within Window
// errors the app.
type RestartPolicy struct {
	Backoff     time.Duration
	MaxBackoff  time.Duration
	MaxRestarts int
	Window      time.Duration
	StableAfter time.Duration
}
