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

// releasesListenNote is what `deployd config check` says of a Node.js app
// that installs releases and has no listen list: the agent learns the port
// from the app's own listen only for an app run from its config folder, so
// a release's workers that listen on a port are refused it, and its first
// deploy fails with nothing serving. "" for any other app.
func releasesListenNote(name string, a *config.App) string {
	if len(a.Listen) > 0 || !a.Releases || !nodejs.Enabled(a.Node, a.Command) {
		return ""
	}
	return "app " + name + " has releases = true and no listen list: deployd does not learn a release's port from its listen call, " +
		"so a release that listens on a port fails its first deploy; add listen = [\"tcp://0.0.0.0:PORT\"] to [apps." + name + "]"
}
