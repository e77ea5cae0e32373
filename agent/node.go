package agent

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers/nodejs"
)

// nodeSpec is the Node.js integration of app with command argv, nil when it
// is off or the command does not run node. The preload file is written (or
// checked) under state_dir here; each worker start checks it again.
func nodeSpec(stateDir string, app *config.App, argv []string, ls []handoff.Bound) (*nodejs.Spec, error) {
	if !nodejs.Enabled(app.Node, argv) {
		return nil, nil
	}
	p, err := nodejs.Install(stateDir)
	if err != nil {
		return nil, fmt.Errorf("app %s: %w", app.Name, err)
	}
	spec := &nodejs.Spec{Preload: p, App: app.Name, ReportReady: app.Ready.Mode == config.ReadyNotify,
		NodeIPC:    app.Ready.Mode == config.ReadyNodeIPC,
		StopSignal: unix.SignalName(app.StopSignal), StopTimeout: app.StopTimeout,
		Indirect: !nodejs.Direct(argv), Health: app.UsesHealthSocket(), Learn: app.DiscoversListen()}
	for _, l := range ls {
		addr := l.Address
		if l.Network != "unix" {
			// The socket's own address: a configured port 0 shows the real one.
			if got, err := l.LocalAddr(); err == nil {
				addr = got
			}
		}
		spec.Listeners = append(spec.Listeners, nodejs.Listener{Network: l.Network, Address: addr})
	}
	return spec, nil
}
