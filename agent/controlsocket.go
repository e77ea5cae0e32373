package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
)

// makeDir creates dir and any missing parent (mode 0755), logs each
// folder it created (as root the agent creates /run/deployd, /var/lib/deployd
// and /var/log/deployd), and returns the topmost one it created, or "".
func makeDir(log hclog.Logger, dir, what string) (string, error) {
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
	log.Info("created folder", "path", top, "for", what)
	return top, nil
}

// envCreatedRunDir passes the control socket's folder, when the first
// agent created it, to the agents its upgrades start: an upgraded agent
// finds the folder there and removes it at shutdown all the same.
const envCreatedRunDir = "DEPLOYD_CREATED_RUN_DIR"

// controlSocket is the agent's control socket: its path, the group it is
// for, and the folder the agent created for it, removed at shutdown.
// createdRunDir is set by listen, before the agent serves, and read by
// remove, after.
type controlSocket struct {
	log           hclog.Logger
	path          string
	group         string // [agent] socket_group: mode 0660 for it
	createdRunDir string // the socket's folder, when this agent created it
}

// listen opens (or inherits, from fds) the control socket, mode 0600 or
// 0660 with socket_group.
func (c *controlSocket) listen(fds fdStore) (net.Listener, error) {
	path := c.path
	created, err := makeDir(c.log, filepath.Dir(path), "control socket")
	if err != nil {
		return nil, err
	}
	c.createdRunDir = created
	if ln, err := fds.Listener("unix", path); err == nil && ln != nil {
		// The folder the first agent created is each next one's to remove.
		c.createdRunDir = os.Getenv(envCreatedRunDir)
		return ln, nil // inherited from the previous agent
	}
	if created != "" {
		os.Setenv(envCreatedRunDir, created) // for the agents an upgrade starts
	}
	if _, err := os.Lstat(path); err == nil {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another deployd agent is running there; "+
				"stop it (`deployd shutdown`) or set [agent] socket to another path", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("control socket %s: %w; another agent may own it: check, then remove the file", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("control socket %s: remove stale socket: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	ln, err := fds.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if g := c.group; g != "" {
		gid, err := LookupGroup(g)
		if err == nil {
			err = os.Chown(path, -1, gid)
		}
		if err == nil {
			err = os.Chmod(path, 0o660)
		}
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("control socket %s: socket_group %q: %w", path, g, err)
		}
	}
	return ln, nil
}

// remove removes the socket file and, when this agent created it and it
// is empty now, its folder (a folder with anything left in it stays).
func (c *controlSocket) remove() {
	if err := handoff.RemoveSocketFile(c.path); err != nil {
		c.log.Warn("control socket left in place", "error", err)
	}
	if c.createdRunDir == "" {
		return
	}
	for d := filepath.Dir(c.path); ; d = filepath.Dir(d) {
		if err := os.Remove(d); err != nil {
			return // not empty, or gone
		}
		c.log.Debug("removed folder", "path", d)
		if d == c.createdRunDir {
			return
		}
	}
}
