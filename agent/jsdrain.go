package agent

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers/jsdrain"
	"github.com/deployd/deployd/workers/nodejs"
)

// jsSpec is the Bun or Deno drain of app with command argv: nil when the
// command runs neither, when node = "off" (the app drains itself), or when
// the Node.js preload is on (node). The preload file is written (or checked)
// under state_dir here; each worker start checks it again.
func jsSpec(stateDir string, app *config.App, argv []string, node bool) (*jsdrain.Spec, error) {
	if node || app.Node == nodejs.ModeOff {
		return nil, nil
	}
	spec, err := jsdrain.Install(stateDir, jsdrain.Detect(argv), unix.SignalName(app.StopSignal), app.StopTimeout)
	if err != nil {
		return nil, fmt.Errorf("app %s: %w", app.Name, err)
	}
	return spec, nil
}
