package cli

import (
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers/nodejs"
)

// nodeMode says, for `deployd config check`, whether app gets the Node.js
// integration and why.
func nodeMode(a *config.App) string {
	on := nodejs.Enabled(a.Node, a.Command)
	switch {
	case a.Node == nodejs.ModeAuto && on:
		return "auto (preload: the command runs node)"
	case a.Node == nodejs.ModeAuto:
		return "auto (off: the command does not run node)"
	case on:
		return "on (preload)"
	}
	return "off"
}
