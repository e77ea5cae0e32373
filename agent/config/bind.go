package config

import (
	"strconv"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/handoff/bindtrap"
	"github.com/deployd/deployd/workers/nodejs"
)

// Values of an app's bind key.
const (
	// BindAuto: the app's own bind of a listen's address takes the agent's
	// socket (a seccomp bind trap), unless the Node.js preload runs.
	BindAuto = "auto"
	// BindInherit: the workers get their listeners at fd 3 and up only
	// (LISTEN_FDS); their own binds run as they ask.
	BindInherit = "inherit"
)

// bind decodes an app's bind key.
func (d *decoder) bind(p toml.Primitive, key []string, a *App) {
	s, ok := get[string](d, p, key)
	if !ok {
		return
	}
	switch s {
	case BindAuto, BindInherit:
		a.Bind = s
	default:
		d.fail(key, strconv.Quote(s), hint(nil,
			`unknown bind; use "auto" (the app's own bind of a listen's address takes the agent's socket) or "inherit" (the app takes fd 3 and up only)`))
	}
}

// TrapsBind reports whether the app's own bind of a listen's address is
// answered with the agent's socket: bind = "auto", a TCP listen, and no
// Node.js preload (which maps node's listen itself).
func (a *App) TrapsBind() bool {
	if a.Bind == BindInherit || nodejs.Enabled(a.Node, a.Command) {
		return false
	}
	for _, l := range a.Listen {
		if l.Network != "unix" {
			return true
		}
	}
	return false
}

// SocketSource says how the app's workers get their listeners, for
// `config check` and status.
func (a *App) SocketSource() string {
	switch {
	case len(a.Listen) == 0 && !a.DiscoversListen():
		return "none"
	case nodejs.Enabled(a.Node, a.Command):
		return "node preload"
	case a.TrapsBind():
		return "answered bind (or fd 3)"
	}
	return "inherited fd 3"
}

// bindDefaults applies what bind = "auto" implies once every key is read:
// a ready the file does not set is "bind" (the app's bind was answered,
// or it said READY=1), and the kernel must be able to answer binds.
func (d *decoder) bindDefaults(apps map[string]*App, names []string) {
	for _, n := range names {
		a := apps[n]
		if a.DiscoversListen() {
			// Its address is learned from its workers' own binds, which
			// the kernel must let the agent answer.
			if err := d.env.bindTrap(); err != nil {
				d.fail([]string{"apps", n, "listen"}, "none", hint(err,
					"the app has no listen list, and its address cannot be learned from its own bind: %v; "+
						"set listen = [\"tcp://0.0.0.0:PORT\"] in [apps.%s]", err, n))
			}
			continue
		}
		if !a.TrapsBind() {
			continue
		}
		if !a.ReadySet {
			a.Ready = Ready{Mode: ReadyBind, Raw: string(ReadyBind)}
		}
		if err := d.env.bindTrap(); err != nil {
			d.fail([]string{"apps", n, "bind"}, strconv.Quote(a.Bind), hint(err,
				"the app's own bind cannot be answered with the agent's socket: %v", err))
		}
	}
}

// bindTrap is hostEnv's check that the kernel can answer binds.
func (e hostEnv) bindTrap() error {
	if e.trapCheck != nil {
		return e.trapCheck()
	}
	return bindtrap.Supported()
}
