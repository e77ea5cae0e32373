// Package nodejs runs unmodified Node.js apps under deployd: it owns the
// preload that the agent's binary embeds (preload.cjs: listen mapping,
// readiness, drain), writes it where only the agent's user can write, tells
// whether a command runs node, and builds the environment that makes node
// load it (NODE_OPTIONS="--require ...", DEPLOYD_NODE).
package nodejs

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed preload.cjs
var preload []byte

// EnvConfig is the variable that carries the preload's JSON config; the
// preload does nothing without it.
const EnvConfig = "DEPLOYD_NODE"

// FirstFD is the lowest fd number of the node channel and of the second
// copy of the listeners: npm and its `sh -c` use the low fds themselves, so
// an inherited fd 3 does not reach the script's node, a high one does.
const FirstFD = 50

// Modes of the app key `node`.
const (
	ModeAuto = "auto" // when the command runs node (Detect)
	ModeOn   = "on"
	ModeOff  = "off"
)

// Enabled tells whether an app with node = mode and command argv gets the preload.
func Enabled(mode string, argv []string) bool {
	switch mode {
	case ModeOn:
		return true
	case ModeOff:
		return false
	}
	return Detect(argv)
}

var nodeTools = map[string]bool{
	"node": true, "nodejs": true, "npm": true, "npx": true, "yarn": true, "pnpm": true,
	"ts-node": true, "tsx": true, "nodemon": true,
}

var shellNode = regexp.MustCompile(`(^|[\s;&|(/])(node|nodejs|npm|npx|yarn|pnpm|ts-node|tsx)(\s|$)`)

// Detect tells whether argv runs node: node itself or a tool that starts
// it (npm, npx, yarn, pnpm, ts-node, tsx), `env node ...`, `sh -c "... node
// ..."`, or a script whose #! line names node.
func Detect(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	base := filepath.Base(argv[0])
	if nodeTools[base] {
		return true
	}
	switch base {
	case "env":
		for _, a := range argv[1:] {
			if !strings.HasPrefix(a, "-") && !strings.Contains(a, "=") {
				return nodeTools[filepath.Base(a)]
			}
		}
		return false
	case "sh", "bash", "dash", "zsh":
		for i, a := range argv[1:] {
			if a == "-c" && i+2 < len(argv) {
				return shellNode.MatchString(argv[i+2])
			}
		}
		return false
	}
	return shebangNode(argv[0])
}

// shebangNode reads the #! line of path. The root agent reads it from a
// release folder the app's user may own: non-blocking, so that a FIFO
// there does not wait for a writer, and a regular file only.
func shebangNode(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	b := make([]byte, 256)
	n, _ := f.Read(b)
	line, _, _ := bytes.Cut(b[:n], []byte{'\n'})
	if !bytes.HasPrefix(line, []byte("#!")) {
		return false
	}
	for _, w := range strings.Fields(string(line[2:])) {
		if nodeTools[filepath.Base(w)] {
			return true
		}
	}
	return false
}

// Listener is a configured listener as the preload sees it.
type Listener struct {
	Network string // tcp, tcp4, tcp6 or unix
	Address string // host:port, or the socket's path
}

// Spec is what a node worker's start needs. Read-only once built.
type Spec struct {
	Preload     *Preload
	App         string
	ReportReady bool // ready = "notify": the preload sends READY=1
	NodeIPC     bool // ready = "node-ipc": a process.send('ready') without a channel comes on the preload's
	StopSignal  string
	StopTimeout time.Duration
	Listeners   []Listener
	// Health: the worker gets a health listener, whose copy follows the
	// listeners' (fd first+len(Listeners)); the preload serves it with the
	// app's first HTTP server.
	Health bool
	// Indirect: the command starts node underneath (npm start, sh -c ...),
	// so the main process is not the app's node.
	Indirect bool
	// Learn: the app has no listen list; its workers run under the bind
	// trap, which answers the bind of a listen(port) with the socket the
	// agent's address policy allows. The preload lets such a listen bind
	// as the app asked, drains the server once it listens, and reports
	// ready then (not before: an app that never listens is never ready).
	Learn bool
}

// Direct tells whether argv's main process is node itself.
func Direct(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	b := filepath.Base(argv[0])
	return b == "node" || b == "nodejs"
}

type wireListener struct {
	FD      int    `json:"fd"`
	Network string `json:"network"`
	Address string `json:"address"`
	Host    string `json:"host,omitempty"`
	Port    int    `json:"port,omitempty"`
	Path    string `json:"path,omitempty"`
}

type wireConfig struct {
	App           string         `json:"app"`
	Ctl           int            `json:"ctl"`
	Ready         bool           `json:"ready"`
	NodeIPC       bool           `json:"nodeIPC,omitempty"`
	StopSignal    string         `json:"stopSignal"`
	StopTimeoutMs int64          `json:"stopTimeoutMs"`
	Listeners     []wireListener `json:"listeners"`
	HealthFD      int            `json:"healthFd,omitempty"`
	// ListenPID: node was started without deployd's exec shim, so the
	// preload sets LISTEN_PID to its pid (when unset) before the app runs.
	ListenPID bool `json:"listenPid,omitempty"`
	Learn     bool `json:"learn,omitempty"`
}

// Env returns env extended for a node worker whose channel is fd ctl and
// whose listener i is fd first+i (and the health listener, with Health,
// first+len(Listeners)): DEPLOYD_NODE, NODE_OPTIONS with the
// preload first and the app's own options kept, PORT when there is one
// TCP listener and env has no PORT, and NODE_APP_INSTANCE (PM2's variable)
// = DEPLOYD_WORKER.
func (s *Spec) Env(env []string, ctl, first int) []string { return s.env(env, ctl, first, false) }

// DirectEnv is Env for a node started without deployd's exec shim: the
// preload sets LISTEN_PID (handoff.Proc.Direct).
func (s *Spec) DirectEnv(env []string, ctl, first int) []string { return s.env(env, ctl, first, true) }

func (s *Spec) env(env []string, ctl, first int, listenPID bool) []string {
	wc := wireConfig{App: s.App, Ctl: ctl, Ready: s.ReportReady, NodeIPC: s.NodeIPC, StopSignal: s.StopSignal,
		StopTimeoutMs: s.StopTimeout.Milliseconds(), Listeners: []wireListener{}, ListenPID: listenPID,
		Learn: s.Learn}
	var tcpPorts []int
	for i, l := range s.Listeners {
		wl := wireListener{FD: first + i, Network: l.Network, Address: l.Address}
		if l.Network == "unix" {
			wl.Path = l.Address
		} else if host, port, err := net.SplitHostPort(l.Address); err == nil {
			wl.Host = host
			wl.Port, _ = strconv.Atoi(port)
			tcpPorts = append(tcpPorts, wl.Port)
		}
		wc.Listeners = append(wc.Listeners, wl)
	}
	if s.Health {
		wc.HealthFD = first + len(s.Listeners)
	}
	b, _ := json.Marshal(wc) // plain types: cannot fail
	out := make([]string, 0, len(env)+3)
	opts, hasPort, slot, hasInstance := "", false, "", false
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "NODE_OPTIONS":
			opts = v
			continue
		case EnvConfig:
			continue
		case "PORT":
			hasPort = true
		case "DEPLOYD_WORKER":
			slot = v
		case "NODE_APP_INSTANCE":
			hasInstance = true
		}
		out = append(out, kv)
	}
	if slot != "" && !hasInstance { // PM2's name for the slot
		out = append(out, "NODE_APP_INSTANCE="+slot)
	}
	req := "--require " + quote(s.Preload.Path)
	if opts != "" {
		req += " " + opts
	}
	out = append(out, "NODE_OPTIONS="+req, EnvConfig+"="+string(b))
	if !hasPort && len(tcpPorts) == 1 && tcpPorts[0] > 0 {
		out = append(out, "PORT="+strconv.Itoa(tcpPorts[0]))
	}
	return out
}

// quote quotes p for NODE_OPTIONS when it needs it (node splits that
// variable at spaces and honours double quotes with backslash escapes).
func quote(p string) string {
	if !strings.ContainsAny(p, " \t\"\\") {
		return p
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(p) + `"`
}

// Sum is the hex sha256 of the embedded preload.
func Sum() string {
	h := sha256.Sum256(preload)
	return hex.EncodeToString(h[:])
}

// Bytes returns a copy of the embedded preload.
func Bytes() []byte { return bytes.Clone(preload) }

func errorf(format string, args ...any) error {
	return fmt.Errorf("node preload: "+format, args...)
}
