package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// makeDir creates dir and any missing parent (mode 0755), logs each
// folder it created (as root the agent creates /run/deployd, /var/lib/deployd
// and /var/log/deployd), and returns the topmost one it created, or "".
func (a *Agent) makeDir(dir, what string) (string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s for the %s: %w", dir, what, err)
	}
	if len(missing) == 0 {
		return "", nil
	}
	top := missing[len(missing)-1]
	a.log.Info("created folder", "path", top, "for", what)
	return top, nil
}

// envCreatedRunDir passes the control socket's folder, when the first
// agent created it, to the agents its upgrades start: an upgraded agent
// finds the folder there and removes it at shutdown all the same.
const envCreatedRunDir = "DEPLOYD_CREATED_RUN_DIR"

// removeCreatedRunDir removes the control socket's folder at shutdown when
// this agent created it and it is empty now (a folder with anything left
// in it stays).
func (a *Agent) removeCreatedRunDir() {
	if a.createdRunDir == "" {
		return
	}
	for d := filepath.Dir(a.socket); ; d = filepath.Dir(d) {
		if err := os.Remove(d); err != nil {
			return // not empty, or gone
		}
		a.log.Debug("removed folder", "path", d)
		if d == a.createdRunDir {
			return
		}
	}
}
