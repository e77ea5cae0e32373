package config

import (
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"aead.dev/minisign"
	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/safeopen"
)

// rootSocket is the control socket of an agent run by root, or by a user
// without XDG_RUNTIME_DIR.
const rootSocket = "/run/deployd/deployd.sock"

// hostEnv is what defaults depend on, behind funcs so tests can pretend to
// be another user on another machine.
type hostEnv struct {
	euid   int
	getenv func(string) string
	home   func() (string, error)
	cpus   func() int
	// checkFolder checks a folder root reads and writes in
	// (safeopen.Trust.CheckFolder); nil skips the check (tests that
	// pretend to be another user).
	checkFolder func(t safeopen.Trust, dir string) error
	// trapCheck, when set, stands for bindtrap.Supported (bind.go).
	trapCheck func() error
}

func currentEnv() hostEnv {
	return hostEnv{euid: os.Geteuid(), getenv: os.Getenv, home: os.UserHomeDir, cpus: UsableCPUs,
		checkFolder: safeopen.Trust.CheckFolder}
}

// DefaultSocket is the control socket path when the config sets none:
// $XDG_RUNTIME_DIR/deployd.sock, or /run/deployd/deployd.sock for root or
// when XDG_RUNTIME_DIR is unset. The CLI uses it to find the agent.
func DefaultSocket() string { return currentEnv().socket() }

func (e hostEnv) socket() string {
	if dir := e.getenv("XDG_RUNTIME_DIR"); e.euid != 0 && filepath.IsAbs(dir) {
		return filepath.Join(dir, "deployd.sock")
	}
	return rootSocket
}

// stateDir is the default state_dir.
func (e hostEnv) stateDir() (string, error) {
	if e.euid == 0 {
		return "/var/lib/deployd", nil
	}
	if dir := e.getenv("XDG_STATE_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "deployd"), nil
	}
	home, err := e.home()
	if err != nil {
		return "", hint(err, "no default (cannot find the home folder: %v); set state_dir, e.g. state_dir = \"/var/lib/deployd\"", err)
	}
	return filepath.Join(home, ".local", "state", "deployd"), nil
}

// logDir is the default log_dir.
func (e hostEnv) logDir(stateDir string) string {
	if e.euid == 0 {
		return "/var/log/deployd"
	}
	return filepath.Join(stateDir, "logs")
}

type rawAgent struct {
	Socket           toml.Primitive `toml:"socket"`
	SocketGroup      toml.Primitive `toml:"socket_group"`
	StateDir         toml.Primitive `toml:"state_dir"`
	LogDir           toml.Primitive `toml:"log_dir"`
	UpgradeTimeout   toml.Primitive `toml:"upgrade_timeout"`
	PIDFile          toml.Primitive `toml:"pid_file"`
	Metrics          toml.Primitive `toml:"metrics"`
	UpgradePublicKey toml.Primitive `toml:"upgrade_public_key"`
	StreamTimeout    toml.Primitive `toml:"stream_timeout"`
}

func agentKey(name string) []string { return []string{"agent", name} }

// agent decodes the [agent] table (absent: all defaults).
func (d *decoder) agent(p toml.Primitive) Agent {
	raw, _ := get[rawAgent](d, p, []string{"agent"})
	a := Agent{UpgradeTimeout: time.Minute, StreamTimeout: 30 * time.Second}
	a.Socket = d.path(raw.Socket, agentKey("socket"), d.env.socket())
	if len(a.Socket) > maxUnixPath {
		d.fail(agentKey("socket"), strconv.Quote(a.Socket), hint(nil, "%d bytes, Unix sockets allow %d; use a shorter path", len(a.Socket), maxUnixPath))
	} else {
		d.claim(agentKey("socket"), Listen{Network: "unix", Address: a.Socket, URL: a.Socket, Name: "control"})
	}
	a.SocketGroup = d.account(raw.SocketGroup, agentKey("socket_group"), true)
	a.StateDir = d.path(raw.StateDir, agentKey("state_dir"), "")
	if a.StateDir == "" {
		dir, err := d.env.stateDir()
		if err != nil {
			d.fail(agentKey("state_dir"), "", err)
		}
		a.StateDir = dir
	}
	a.LogDir = d.path(raw.LogDir, agentKey("log_dir"), d.env.logDir(a.StateDir))
	d.duration(raw.UpgradeTimeout, agentKey("upgrade_timeout"), &a.UpgradeTimeout, false)
	a.PIDFile = d.path(raw.PIDFile, agentKey("pid_file"), "")
	a.Metrics = d.metrics(raw.Metrics, agentKey("metrics"))
	a.UpgradePublicKey = d.publicKey(raw.UpgradePublicKey, agentKey("upgrade_public_key"))
	d.duration(raw.StreamTimeout, agentKey("stream_timeout"), &a.StreamTimeout, false)
	return a
}

// path decodes a path, made absolute against the config folder; def when
// the key is absent or bad.
func (d *decoder) path(p toml.Primitive, key []string, def string) string {
	s, ok := get[string](d, p, key)
	if !ok {
		return def
	}
	if strings.TrimSpace(s) == "" {
		d.fail(key, `""`, hint(nil, "must not be empty; remove the line for the default, or write a path%s", fix(key)))
		return def
	}
	return d.abs(s)
}

func (d *decoder) abs(path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(d.dir, path)
}

func (d *decoder) metrics(p toml.Primitive, key []string) string {
	s, ok := get[string](d, p, key)
	if !ok {
		return ""
	}
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		n, perr := strconv.Atoi(port)
		err = perr
		if perr == nil && (n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "") {
			err = strconv.ErrRange
		}
	}
	if err != nil {
		d.fail(key, strconv.Quote(s), hint(err, `not host:port with a port from 1 to 65535; write e.g. metrics = "127.0.0.1:9901", or remove the line to turn metrics off`))
		return ""
	}
	if !d.claim(key, Listen{Network: "tcp", Address: s, URL: s, Name: "metrics"}) {
		return ""
	}
	return s
}

func (d *decoder) publicKey(p toml.Primitive, key []string) string {
	s, ok := get[string](d, p, key)
	if !ok {
		return ""
	}
	s = strings.TrimSpace(s)
	var pk minisign.PublicKey
	if err := pk.UnmarshalText([]byte(s)); err != nil {
		d.fail(key, formatValue(s), hint(err, "not a minisign public key (%v); paste the key line (it starts with RW) of the .pub file that minisign -G wrote", err))
		return ""
	}
	return s
}

// account decodes a user (group false) or group name that must exist.
func (d *decoder) account(p toml.Primitive, key []string, group bool) string {
	name, ok := get[string](d, p, key)
	if !ok {
		return ""
	}
	if err := lookupAccount(name, group); err != nil {
		what, create := "user", "useradd"
		if group {
			what, create = "group", "groupadd"
		}
		d.fail(key, strconv.Quote(name), hint(err, "no such %s on this host; create it (%s) or fix the name", what, create))
		return ""
	}
	return name
}

// lookupAccount checks that a user or group exists, by name or numeric id.
func lookupAccount(name string, group bool) error {
	byName, byID := func(s string) error { _, err := user.Lookup(s); return err },
		func(s string) error { _, err := user.LookupId(s); return err }
	if group {
		byName = func(s string) error { _, err := user.LookupGroup(s); return err }
		byID = func(s string) error { _, err := user.LookupGroupId(s); return err }
	}
	if name == "" {
		return os.ErrNotExist
	}
	err := byName(name)
	if _, numErr := strconv.Atoi(name); err != nil && numErr == nil {
		err = byID(name)
	}
	return err
}
