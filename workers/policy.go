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
	// ReadyHTTP: GET Path on the worker's private health socket answers
	// 2xx (READY=1 on NOTIFY_SOCKET does not count then).
	ReadyHTTP ReadyMode = "http"
	// ReadyBind: the worker's own bind of every configured listen was
	// answered with the agent's socket (Spec.BindTrap), or READY=1 came
	// on NOTIFY_SOCKET, whichever is first.
	ReadyBind ReadyMode = "bind"
)

// ReadyPolicy is the readiness policy of a spec.
type ReadyPolicy struct {
	Mode  ReadyMode
	Regex *regexp.Regexp // ReadyLog
	Delay time.Duration  // ReadyDelay
	Path  string         // ReadyHTTP: the request path, e.g. "/healthz"
}

// HealthPolicy is the liveness check of a spec: every Interval a ready
// worker gets GET Path on its private health socket; an answer other than
// 2xx within Timeout is a failure, and Failures in a row replace the worker
// (a new one ready first, as max_memory does).
type HealthPolicy struct {
	Path     string
	Interval time.Duration
	Timeout  time.Duration
	Failures int
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
