// Package api holds the control protocol between the CLI and the agent:
// HTTP+JSON on the agent's Unix socket. It has the wire types and the client.
package api

import (
	"fmt"
	"time"
)

// Paths of the control API.
const (
	PathStatus   = "/v1/status"
	PathReload   = "/v1/reload"
	PathRestart  = "/v1/restart"
	PathShutdown = "/v1/shutdown"
	PathVersion  = "/v1/version"
)

// MaxRequestBytes bounds a request body.
const MaxRequestBytes = 1 << 20

// Status is the answer of GET /v1/status.
type Status struct {
	Agent Agent `json:"agent"`
	Apps  []App `json:"apps"`
}

// Agent describes the agent process.
type Agent struct {
	Version       string  `json:"version"`
	PID           int     `json:"pid"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	Config        string  `json:"config"`
	Socket        string  `json:"socket"`
	RSSBytes      int64   `json:"rss_bytes"`
}

// App is one app's state.
type App struct {
	Name      string   `json:"name"`
	State     string   `json:"state"`
	Release   string   `json:"release"`
	Instances int      `json:"instances"`
	Listen    []string `json:"listen"`
	// Balance is how new connections reach the workers: "shared", "even"
	// or "sticky" (docs/balance.md); "shared" where the kernel could not
	// steer, with a warning. The default "auto" shows as "shared" until
	// a worker bound the address itself, then "even".
	Balance string `json:"balance"`
	// Spares is how many of Workers are spares (not counted in Instances).
	Spares int `json:"spares,omitempty"`
	// Paused is the app's connection pause (deployd pause), absent when
	// new connections reach the workers.
	Paused    *Pause   `json:"paused,omitempty"`
	Restarts  int      `json:"restarts"`
	LastExit  string   `json:"last_exit,omitempty"`
	LastLines []string `json:"last_lines,omitempty"`
	// Warnings are accept queues that grow while no worker accepts.
	Warnings []string `json:"warnings,omitempty"`
	// AcceptQueues are the TCP listeners' accept queues, read once a
	// second: connections the kernel holds that no worker accepted yet.
	AcceptQueues []AcceptQueue `json:"accept_queues,omitempty"`
	Workers      []Worker      `json:"workers"`
	// Draining are old workers a reload (or a replacement) replaced, still
	// draining in the background (state "draining") until they exit or
	// their stop_timeout passes; not counted among the app's workers.
	Draining []Worker `json:"draining,omitempty"`
	// DroppedLogLines counts the output lines of the app's workers the agent
	// could not write to its log files (disk full or too slow).
	DroppedLogLines uint64 `json:"dropped_log_lines"`
	// Canary is the held canary (state "canary"); LastCanary says how the
	// last one ended, until the app's next operation.
	Canary     *Canary    `json:"canary,omitempty"`
	LastCanary *CanaryEnd `json:"last_canary,omitempty"`
	// Scaled is the count `deployd scale` set, which overrides the
	// config's instances; 0 when the config's count applies.
	Scaled int `json:"scaled,omitempty"`
}

// AcceptQueue is a listener's accept queue. Of a steered listener
// (balance even or sticky), the sums over its workers' own sockets.
type AcceptQueue struct {
	Listen  string `json:"listen"` // "tcp 127.0.0.1:8080"
	Queued  int    `json:"queued"`
	Backlog int    `json:"backlog"`
}

// Worker is one worker process.
type Worker struct {
	Slot       int    `json:"slot"`
	PID        int    `json:"pid"`
	State      string `json:"state"`
	Release    string `json:"release"`
	Generation int    `json:"generation"`
	Restarts   int    `json:"restarts"`
	// Replacements by max_memory, the watchdog and the health check.
	MemoryReplacements   int `json:"memory_replacements,omitempty"`
	WatchdogReplacements int `json:"watchdog_replacements,omitempty"`
	HealthReplacements   int `json:"health_replacements,omitempty"`
	// HealthFailures is the current run of failed health checks,
	// HealthFailuresTotal all of them; HealthError the last failure, empty
	// once a check passed.
	HealthFailures      int     `json:"health_failures,omitempty"`
	HealthFailuresTotal int     `json:"health_failures_total,omitempty"`
	HealthError         string  `json:"health_error,omitempty"`
	UptimeSeconds       float64 `json:"uptime_seconds"`
	ReadyMillis         int64   `json:"ready_ms,omitempty"`
	CPUPercent          float64 `json:"cpu_percent"`
	RSSBytes            int64   `json:"rss_bytes"`
	Status              string  `json:"status,omitempty"`
	// RecycleInSeconds is how long until recycle_after or recycle_at
	// replaces the worker (0 once due); absent when both are off.
	RecycleInSeconds *float64 `json:"recycle_in_seconds,omitempty"`
	// RecycleBy is the setting that recycles it then: "recycle_after"
	// or "recycle_at".
	RecycleBy string `json:"recycle_by,omitempty"`
	// Spare: ready, but given no connection until it takes the place of
	// a worker that crashed (the app's spares), or, a new worker of a
	// steered app, until its reload switches it in.
	Spare bool `json:"spare,omitempty"`
	// NewConnections counts the new connections kernel steering gave the
	// worker since it took its place (balance even or sticky only).
	NewConnections *uint64 `json:"new_connections,omitempty"`
	// Queued counts the connections waiting in the accept queue of the
	// worker's own socket (balance even or sticky only; absent when not
	// known), read once a second.
	Queued *int `json:"queued,omitempty"`
	// Connections, of a draining worker only, counts the established TCP
	// connections on the app's listeners it still holds; absent where
	// that is not known (an agent not run as root, a worker of another
	// user).
	Connections *int `json:"connections,omitempty"`
	// Socket says how the worker got its listeners: "inherited fd" (fd 3
	// and up), "node preload" (deployd's Node.js preload mapped its
	// listen) or "answered bind (N of M binds took the agent's socket; a
	// socket of its own)" (its own bind was answered with a socket of the
	// agent's: its own in a steered pool, else "the shared socket"; "before
	// this agent" for an adopted worker that holds its own).
	Socket string `json:"socket,omitempty"`
}

// ReloadRequest is the body of POST /v1/reload.
type ReloadRequest struct {
	Apps     []string `json:"apps,omitempty"` // empty = all
	Strategy string   `json:"strategy,omitempty"`
	// Canary > 0 moves that many workers of each app and holds (canary.go).
	Canary int `json:"canary,omitempty"`
}

// AppRequest names one app (restart).
type AppRequest struct {
	App string `json:"app"`
}

// EventType names a progress step of an operation.
type EventType string

// Event types (the "type" of an Event on the wire).
const (
	EventStarted  EventType = "started"  // a new worker was started
	EventReady    EventType = "ready"    // a worker is ready
	EventDraining EventType = "draining" // an old worker got its stop signal
	EventExited   EventType = "exited"   // a worker exited
	EventFailed   EventType = "failed"   // a step failed (the operation goes back)
	EventRollback EventType = "rollback" // an abandoned operation rolls back
	EventNotice   EventType = "notice"   // a note about the operation
	EventRemoved  EventType = "removed"  // an app left the config and is stopping
	EventServing  EventType = "serving"  // a new worker took over its slot
	EventCutover  EventType = "cutover"  // blue-green on a steered pool: the new workers took every position at once (Time: just before)
	EventCrash    EventType = "crash"    // a worker exited on its own
	EventRestart  EventType = "restart"  // a crashed worker's slot got a new worker
	EventErrored  EventType = "errored"  // too many crashes: no more restarts
	EventReplace  EventType = "replace"  // max_memory or watchdog replaced a worker
	EventState    EventType = "state"    // the app's state changed (Message: the new state)
	EventSlots    EventType = "slots"    // the number of slots changed
	EventHook     EventType = "hook"     // a deploy hook started or ended (Message says how)
)

// Event is one progress step of an operation.
type Event struct {
	Time    time.Time `json:"time"`
	App     string    `json:"app"`
	Type    EventType `json:"type"`
	Slot    int       `json:"slot"`
	PID     int       `json:"pid,omitempty"`
	Release string    `json:"release,omitempty"`
	Millis  int64     `json:"ms,omitempty"`
	Message string    `json:"message,omitempty"`
}

// StreamLine is one line of a streamed answer: an event, or the final result.
type StreamLine struct {
	Event  *Event        `json:"event,omitempty"`
	Result *Result       `json:"result,omitempty"`
	Deploy *DeployResult `json:"deploy,omitempty"`
}

// Result ends an operation.
type Result struct {
	OK   bool        `json:"ok"`
	Apps []AppResult `json:"apps"`
	// Deploy is set for deploy and rollback.
	Deploy *DeployResult `json:"-"`
}

// Outcomes of an operation on one app.
const (
	OutcomeDone      = "done"
	OutcomeAbandoned = "abandoned" // new version never got ready; old still serving
	OutcomeFailed    = "failed"
	OutcomeRefused   = "refused" // another operation on the app is running
)

// AppResult is the outcome for one app.
type AppResult struct {
	App             string   `json:"app"`
	Outcome         string   `json:"outcome"`
	Release         string   `json:"release,omitempty"`
	Error           string   `json:"error,omitempty"`
	ExitStatus      string   `json:"exit_status,omitempty"`
	LastLines       []string `json:"last_lines,omitempty"`
	DurationSeconds float64  `json:"duration_seconds"`
	// Canary is the hold a reload --canary started (outcome "held");
	// CanaryEnd how promote or abort ended one.
	Canary    *Canary    `json:"canary,omitempty"`
	CanaryEnd *CanaryEnd `json:"canary_end,omitempty"`
	// Hooks is the after hook a promote of a deployed canary ran.
	Hooks []HookResult `json:"hooks,omitempty"`
}

// Error is the body of every non-2xx answer. Kind is how the request
// ended (see outcome.go); older agents leave it out.
type Error struct {
	Error string `json:"error"`
	Kind  Kind   `json:"kind,omitempty"`
	// Reason is a stable name of what was wrong with a refused input
	// (e.g. "checksum-mismatch", "signature-required"), for the CLI to
	// add the fix in its own words (its flags).
	Reason string `json:"reason,omitempty"`
}

// VersionInfo is the answer of GET /v1/version.
type VersionInfo struct {
	Version string `json:"version"`
	PID     int    `json:"pid"`
}

// PathUpgrade is POST: hand every socket to a new agent binary.
const PathUpgrade = "/v1/upgrade"

// UpgradeRequest is the body of POST /v1/upgrade. With Attached, the new
// binary is the file descriptor passed with the request (fds.go). Without
// it and with Binary empty the agent re-executes the binary at its own path
// (as on SIGHUP).
type UpgradeRequest struct {
	Attached bool `json:"attached,omitempty"`
	// Binary and Signature are paths the agent opens itself: refused for
	// callers other than root and the agent's uid (older CLIs sent them).
	Binary    string `json:"binary,omitempty"`
	Signature string `json:"signature,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
	// SignatureText is the content of the minisign signature of the binary.
	SignatureText string `json:"signature_text,omitempty"`
	// RestartWorkers makes the new agent start new workers for every app
	// (the old one drains its own) instead of adopting the running ones.
	RestartWorkers bool `json:"restart_workers,omitempty"`
}

// UpgradeResult is the answer of a successful upgrade.
type UpgradeResult struct {
	OldVersion      string  `json:"old_version"`
	OldPID          int     `json:"old_pid"`
	NewVersion      string  `json:"new_version"`
	NewPID          int     `json:"new_pid,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// Paths of the release API.
const (
	PathDeploy   = "/v1/deploy"   // POST, streamed
	PathRollback = "/v1/rollback" // POST, streamed
	PathReleases = "/v1/releases" // GET ?app=
)

// DeployRequest is the body of POST /v1/deploy. With Attached, the artifact
// is the file descriptor passed with the request (fds.go): an executable or
// a .tar.gz (Kind "file" or "tar.gz", a regular file), or a folder the
// client packed as an uncompressed tar stream in deterministic order (Kind
// "dir", usually a pipe). Name is the artifact's base name. Without
// Attached, Artifact is an absolute path the agent opens itself: refused
// for callers other than root and the agent's uid.
type DeployRequest struct {
	App      string `json:"app"`
	Attached bool   `json:"attached,omitempty"`
	Kind     string `json:"kind,omitempty"`
	Name     string `json:"name,omitempty"`
	Artifact string `json:"artifact,omitempty"`
	Version  string `json:"version,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Strategy string `json:"strategy,omitempty"`
	// Canary > 0 moves that many workers to the release and holds.
	Canary int `json:"canary,omitempty"`
}

// RollbackRequest is the body of POST /v1/rollback; To "" = the previous release.
type RollbackRequest struct {
	App      string `json:"app"`
	To       string `json:"to,omitempty"`
	Strategy string `json:"strategy,omitempty"`
}

// Deploy outcomes.
const (
	DeployDeployed   = "deployed"
	DeployRolledBack = "rolled-back"
	DeployUnchanged  = "unchanged" // the version was current already
	DeployFailed     = "failed"
	DeployRefused    = "refused" // the before hook failed: nothing changed
)

// DeployResult ends a deploy or rollback (the last line of --json).
type DeployResult struct {
	App             string   `json:"app"`
	Version         string   `json:"version"`
	Previous        string   `json:"previous"`
	Status          string   `json:"status"`
	DurationSeconds float64  `json:"duration_seconds"`
	Error           string   `json:"error,omitempty"`
	ExitStatus      string   `json:"exit_status,omitempty"`
	LastLines       []string `json:"last_lines,omitempty"`
	// Canary is the hold a deploy --canary started (status "held").
	Canary *Canary `json:"canary,omitempty"`
	// Hooks are the hooks that ran, in order (before, after).
	Hooks []HookResult `json:"hooks,omitempty"`
}

// HookResult is how one deploy hook ended.
type HookResult struct {
	Hook            string   `json:"hook"` // "before" or "after"
	Command         []string `json:"command"`
	OK              bool     `json:"ok"`
	ExitStatus      string   `json:"exit_status"` // "exit status 0", "exit status 3", "timed out after 5m0s"
	DurationSeconds float64  `json:"duration_seconds"`
	Error           string   `json:"error,omitempty"`
	// LastLines are its last lines of output (stdout and stderr).
	LastLines []string `json:"last_lines,omitempty"`
}

// ReleaseInfo is one release in GET /v1/releases.
type ReleaseInfo struct {
	Version     string    `json:"version"`
	InstalledAt time.Time `json:"installed_at"`
	SHA256      string    `json:"sha256"`
	Size        int64     `json:"size"`
	Status      string    `json:"status"` // current, previous, failed, available
}

// Releases is the answer of GET /v1/releases.
type Releases struct {
	App      string        `json:"app"`
	Releases []ReleaseInfo `json:"releases"`
}

// Paths of the operations API (all POST, streamed).
const (
	PathScale  = "/v1/scale"
	PathStop   = "/v1/stop"
	PathStart  = "/v1/start"
	PathPause  = "/v1/pause"  // body PauseRequest
	PathResume = "/v1/resume" // body AppRequest
)

// PauseRequest is the body of POST /v1/pause: new connections of App wait
// in the kernel until /v1/resume, or for MaxSeconds (> 0) at most.
type PauseRequest struct {
	App        string  `json:"app"`
	MaxSeconds float64 `json:"max_seconds,omitempty"`
}

// Pause describes a connection pause in effect.
type Pause struct {
	SinceSeconds float64 `json:"since_seconds"` // how long it has lasted
	// EndsInSeconds is how long until it ends by itself; absent without
	// a maximum (it lasts until deployd resume).
	EndsInSeconds *float64 `json:"ends_in_seconds,omitempty"`
	// Queued connections wait; Backlog is how many can.
	Queued  int `json:"queued"`
	Backlog int `json:"backlog"`
}

// ScaleReset, as ScaleRequest.Instances, goes back to the config's
// instances and drops the count `deployd scale` set.
const ScaleReset = "reset"

// ScaledMessage says that app runs n workers as `deployd scale` set them,
// not the config's instances, and how to change that.
func ScaledMessage(app string, n, instances int) string {
	workers := "workers"
	if n == 1 {
		workers = "worker"
	}
	return fmt.Sprintf("%d %s as scaled by `deployd scale` (config says %d); run `deployd scale %s %d` or `deployd scale %s --reset` to follow the config",
		n, workers, instances, app, instances, app)
}

// ScaleRequest is the body of POST /v1/scale: Instances is "N", "+N", "-N"
// or ScaleReset.
type ScaleRequest struct {
	App       string `json:"app"`
	Instances string `json:"instances"`
}
