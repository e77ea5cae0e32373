// Package config loads and validates deployd.toml: the agent's settings and
// one [apps.NAME] table per app. Every error names the file, the line, the key
// and how to fix it; a config that loads is complete (defaults applied, paths
// absolute, durations and signals parsed).
package config

import (
	"regexp"
	"syscall"
	"time"

	"github.com/deployd/deployd/internal/addrpolicy"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/internal/safeopen"
)

// Config is a loaded, validated deployd.toml.
type Config struct {
	// Path is the absolute path of the file it was loaded from.
	Path  string
	Agent Agent
	// Apps by name; AppNames lists the names sorted.
	Apps     map[string]*App
	AppNames []string
	// Warnings are notes about a valid config that probably does not do
	// what its author means (warnings.go).
	Warnings []Problem
	// trust is who besides root may write the folders root works in
	// (checkFolders, CheckSocketFolder).
	trust safeopen.Trust
}

// Agent holds the [agent] table.
type Agent struct {
	// Socket is the control socket path. Default: $XDG_RUNTIME_DIR/deployd.sock,
	// or /run/deployd/deployd.sock when running as root (or XDG_RUNTIME_DIR unset).
	Socket string
	// SocketGroup, when set, makes the control socket 0660 owned by that group.
	SocketGroup string
	// StateDir holds state.json and releases/. Default /var/lib/deployd for root,
	// else $XDG_STATE_HOME/deployd (~/.local/state/deployd).
	StateDir string
	// LogDir holds the app logs. Default /var/log/deployd for root, else
	// StateDir/logs.
	LogDir string
	// UpgradeTimeout bounds an agent self-upgrade (handoff). Default 1m.
	UpgradeTimeout time.Duration
	// PIDFile, when set, is written with the agent's pid when it is ready.
	PIDFile string
	// Metrics is a listen address for Prometheus metrics, empty = off.
	Metrics string
	// UpgradePublicKey is a minisign public key; when set, upgrades need a signature.
	UpgradePublicKey string
	// StreamTimeout is how long the agent waits for the next bytes of an
	// artifact a client streams before it refuses the deploy. Default 30s.
	StreamTimeout time.Duration
}

// ReadyMode is how a worker tells it is ready.
type ReadyMode string

// Ready modes.
const (
	ReadyNotify  ReadyMode = "notify"   // READY=1 on NOTIFY_SOCKET
	ReadyNodeIPC ReadyMode = "node-ipc" // process.send('ready') on NODE_CHANNEL_FD
	ReadyLog     ReadyMode = "log"      // an output line matches Regex
	ReadyDelay   ReadyMode = "delay"    // alive for Delay
	ReadyHTTP    ReadyMode = "http"     // GET Path on the worker's health socket answers 2xx
	// ReadyBind: the worker's own bind of every listen was answered (or
	// READY=1 came first); the default of an app whose binds are answered.
	ReadyBind ReadyMode = "bind"
)

// Ready is a parsed `ready = "..."` value.
type Ready struct {
	Mode  ReadyMode
	Regex *regexp.Regexp // ReadyLog
	Delay time.Duration  // ReadyDelay
	Path  string         // ReadyHTTP, e.g. "/healthz"
	// Raw is the value as written in the file.
	Raw string
}

// Listen is one parsed `listen` URL.
type Listen struct {
	// Network is "tcp", "tcp4", "tcp6" or "unix".
	Network string
	// Address is host:port for tcp (as written, e.g. "127.0.0.1:8080",
	// "[::1]:8080", ":8080"), an absolute path for unix.
	Address string
	// Name is the LISTEN_FDNAMES entry: the URL's fragment (#name) or, by
	// default, the app name.
	Name string
	// URL is the value as written in the file.
	URL string
}

// Restart is the [apps.NAME.restart] crash-restart policy.
type Restart struct {
	Backoff     time.Duration // first delay, default 100ms
	MaxBackoff  time.Duration // cap, default 30s
	MaxRestarts int           // within Window before the app is errored, default 10
	Window      time.Duration // default 1m
	// StableAfter: a worker that became ready and ran this long before it
	// crashed is restarted at once and resets its backoff; one that died
	// sooner is in a crash loop and waits the backoff. Default 1s, PM2's
	// min_uptime (key `stable_after`).
	StableAfter time.Duration
}

// DefaultMinReady is the default bake time of a new worker (min_ready): a
// release that dies within it of getting ready is abandoned before any old
// worker stops.
const DefaultMinReady = time.Second

// App is one [apps.NAME] table.
type App struct {
	Name    string
	Command []string // argv; Command[0] resolved: absolute path, or a path relative to the release dir when Releases
	Cwd     string   // absolute; default the config file's folder
	// Env is the app's own variables, sorted "K=V" entries: those of `env`,
	// with those of the selected environment's table (env_NAME) over them,
	// and of the env_file. Workers and hooks get them on top of a clean
	// environment (the agent's PATH, locale, ...; the app user's HOME and
	// USER), never the agent's whole environment.
	Env []string
	// Environment is the selected environment (`environment = "NAME"`,
	// whose variables are the [apps.APP.env_NAME] table's), "" for none;
	// Environments lists the env_NAME tables the app has, sorted.
	Environment  string
	Environments []string
	// EnvFile is the env_file read into Env ("" = none): kept to name it.
	EnvFile string
	// EnvInherit names the agent's own variables that pass to the workers
	// and hooks as they are, sorted.
	EnvInherit []string
	// Instances is the resolved worker count (>= 1); InstancesSpec the raw
	// value ("max", "4", "-1").
	Instances     int
	InstancesSpec string
	Listen        []Listen
	// AllowPorts are the TCP ports the app's own code may take when it has
	// no listen list (allow_ports); nil: every port from 1024 up. Root's
	// choice: the code asks, the config decides (addrpolicy).
	AllowPorts   []addrpolicy.PortRange
	Ready        Ready
	ReadyTimeout time.Duration // default 30s
	// MinReady is how long a new worker must stay up after ready before the
	// old one it replaces is stopped; default DefaultMinReady, 0 = off.
	MinReady time.Duration
	// TCPNoDelay sets TCP_NODELAY on the app's TCP listeners (accepted
	// sockets inherit it); default true.
	TCPNoDelay bool
	// Balance is how new connections reach the workers: "auto" (the
	// default: "shared" until a worker binds the address itself, its bind
	// answered; then "even"), "shared" (one listening socket all workers
	// accept on), "even" or "sticky" (a socket per worker, steered by the
	// kernel; docs/balance.md).
	Balance string
	// Spares are ready workers on top of Instances that get no connection
	// until one takes a crashed worker's place (balance even or sticky).
	Spares      int
	StopSignal  syscall.Signal
	StopTimeout time.Duration // default 30s
	// QuietTimeout bounds the wait, before the stop signal, for what a
	// worker with its own socket (balance even or sticky) was given but
	// has not read; default 5s, 0 turns it off.
	QuietTimeout time.Duration
	Nonblocking  bool // hand listeners over in non-blocking mode
	MaxSurge     int  // extra workers during a rolling reload, default 1
	// CanaryTimeout ends a canary's hold by itself after this long with
	// CanaryAction ("abort", the default, or "promote"); 0 (default) holds
	// until `deployd promote` or `deployd abort`.
	CanaryTimeout time.Duration
	CanaryAction  string
	Restart       Restart
	// Releases: the app runs releases installed by `deployd deploy`.
	Releases     bool
	KeepReleases int // default 5
	// MaxMemory in bytes, 0 = no limit.
	MaxMemory int64
	// Limits are the workers' cgroup resource limits (limits.go).
	Limits      procunit.Limits
	CPUAffinity bool
	User, Group string
	// MembersMayRunAsRoot lets socket_group members change the app (deploy,
	// reload, restart, ...) although it runs as root: no user, or a user
	// whose uid is 0, under a root agent. Off, the agent refuses them.
	MembersMayRunAsRoot bool
	// Watchdog: a worker must send WATCHDOG=1 at least this often; 0 = off.
	Watchdog time.Duration
	// RecycleAfter: each worker is replaced (a new one ready first) once it
	// has run this long, plus up to a tenth more as jitter; 0 = off.
	RecycleAfter time.Duration
	// RecycleAt: a crontab schedule (ParseRecycleAt); at each of its
	// times every worker started before it is replaced the same way,
	// one at a time; "" = off.
	RecycleAt string
	Logs      Logs
	// Health is the [apps.NAME.health] liveness check, nil when off.
	Health *Health
	// Node is the Node.js integration (a preload that maps listen(port),
	// reports readiness and drains): "auto" (default: when the command runs
	// node), "on" or "off".
	Node string
	// Hooks are run by deploy and rollback (hooks.go).
	Hooks Hooks
	// Bind is how the workers get their TCP listeners (bind.go): "auto"
	// (the default: the app's own bind of a listen's address is answered
	// with the agent's socket, unless the Node.js preload runs) or
	// "inherit" (fd 3 and up only). ReadySet: the file names ready.
	Bind     string
	ReadySet bool
}

// Health is the [apps.NAME.health] table: every Interval each ready worker
// gets GET Path on its private health socket (the listener named
// "deployd-health" in LISTEN_FDNAMES); no 2xx within Timeout is a failure,
// and Failures in a row replace the worker, new one ready first.
type Health struct {
	Path     string        // default: the path of ready = "http:PATH"
	Interval time.Duration // default 5s
	Timeout  time.Duration // default 2s, at most Interval
	Failures int           // default 3
}

// Logs is the [apps.NAME.logs] table.
type Logs struct {
	Format   string // "text" (default), "raw", "json" or "pm2-json"
	Target   string // "files" (default), "journal" or "both"
	MaxSize  int64  // bytes before rotation, default 100 MiB
	MaxFiles int    // rotated files kept, default 10
	MaxAge   time.Duration
	Compress bool
}
