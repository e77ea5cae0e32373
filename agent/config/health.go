package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/workers/nodejs"
)

// Defaults of the [apps.NAME.health] table.
const (
	DefaultHealthInterval = 5 * time.Second
	DefaultHealthTimeout  = 2 * time.Second
	DefaultHealthFailures = 3
)

type rawHealth struct {
	Path     toml.Primitive `toml:"path"`
	Interval toml.Primitive `toml:"interval"`
	Timeout  toml.Primitive `toml:"timeout"`
	Failures toml.Primitive `toml:"failures"`
}

// health decodes the [apps.NAME.health] table; nil when there is none.
// Its path defaults to the one of ready = "http:PATH".
func (d *decoder) health(p toml.Primitive, key []string, ready Ready) *Health {
	raw, ok := get[rawHealth](d, p, key)
	if !ok {
		return nil
	}
	k := func(name string) []string { return append(slices.Clone(key), name) }
	h := &Health{Path: ready.Path, Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout,
		Failures: DefaultHealthFailures}
	if s, ok := get[string](d, raw.Path, k("path")); ok {
		if path, err := parseHealthPath(s); err != nil {
			d.fail(k("path"), strconv.Quote(s), err)
		} else {
			h.Path = path
		}
	} else if !d.md.IsDefined(k("path")...) && h.Path == "" {
		d.fail(k("path"), "", hint(nil, `missing: write the path the app answers health checks on, e.g. path = "/healthz" `+
			`(it defaults to the path of ready = "http:PATH", which this app does not use)`))
	}
	d.duration(raw.Interval, k("interval"), &h.Interval, false)
	d.duration(raw.Timeout, k("timeout"), &h.Timeout, false)
	d.integer(raw.Failures, k("failures"), &h.Failures, 1)
	if h.Timeout > h.Interval {
		d.fail(k("timeout"), strconv.Quote(h.Timeout.String()),
			hint(nil, "must be at most interval (%s): one check ends before the next starts; lower timeout or raise interval", h.Interval))
	}
	return h
}

// HealthFDName is the LISTEN_FDNAMES entry of a worker's health listener
// (as handoff.HealthFDName; config does not import handoff).
const HealthFDName = "deployd-health"

// UsesHealthSocket tells whether the app's workers get a health listener.
func (a *App) UsesHealthSocket() bool { return a.Ready.Mode == ReadyHTTP || a.Health != nil }

// HealthNote says what an app with health checks must do; "" without them.
// `deployd config check` prints it for each such app.
func (a *App) HealthNote() string {
	if !a.UsesHealthSocket() {
		return ""
	}
	after := "the last inherited fd"
	if n := len(a.Listen); n == 1 {
		after = "after the listen socket"
	} else if n > 1 {
		after = fmt.Sprintf("after the %d listen sockets", n)
	}
	return fmt.Sprintf("health checks go to each worker's own listener, fd %d (%s), named %q in LISTEN_FDNAMES: "+
		"the app must serve every inherited socket, as gunicorn, Puma, deployd's Node.js integration and its "+
		"Go package worker do; an app that serves only fd 3 never gets ready", 3+len(a.Listen), after, HealthFDName)
}

// healthWarning is a warning for an app with health checks whose command
// looks like it serves only one inherited fd, nil otherwise.
func healthWarning(a *App, file string, kl keyLines) *Problem {
	if !a.UsesHealthSocket() {
		return nil
	}
	key := []string{"apps", a.Name, "ready"}
	value := strconv.Quote(a.Ready.Raw)
	if a.Ready.Mode != ReadyHTTP {
		key, value = []string{"apps", a.Name, "health"}, ""
	}
	var msg string
	switch {
	case servesOneFD(a.Command, "uvicorn", "--fd"):
		msg = "uvicorn --fd N serves only that fd, so the health checks (on fd " + strconv.Itoa(3+len(a.Listen)) +
			`, named "` + HealthFDName + `") are never answered and no worker gets ready; run it under gunicorn, ` +
			"which serves every inherited socket: gunicorn -k uvicorn.workers.UvicornWorker app:app (no --bind)"
	case a.Node == nodejs.ModeOff && nodejs.Detect(a.Command):
		msg = `node = "off": the app passes its listeners itself (listen({fd: 3})), so it must also serve fd ` +
			strconv.Itoa(3+len(a.Listen)) + ` (named "` + HealthFDName + `") with its request handler, or no worker ` +
			`gets ready; or remove node = "off" and the Node.js integration serves it`
	default:
		return nil
	}
	return &Problem{File: file, Line: kl.find(key), Key: keyString(key), Value: value, Msg: msg}
}

// servesOneFD tells whether argv runs tool with the one-fd flag.
func servesOneFD(argv []string, tool, flag string) bool {
	has := func(want string, eq bool) bool {
		for _, a := range argv {
			if filepath.Base(a) == want || eq && strings.HasPrefix(a, want+"=") {
				return true
			}
		}
		return false
	}
	return has(tool, false) && !has("gunicorn", false) && has(flag, true)
}

// DiscoversListen tells an app whose listener the agent learns from the app
// itself: a Node.js app (the preload sees its listen call) with no listen
// list, running its command (a release's command may listen elsewhere: an
// app with releases names its listeners).
func (a *App) DiscoversListen() bool {
	return len(a.Listen) == 0 && !a.Releases && nodejs.Enabled(a.Node, a.Command)
}
