package handoff

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// HealthFDName is the LISTEN_FDNAMES entry of a worker's private health
// listener: the last fd of LISTEN_FDS when the app has health checks.
const HealthFDName = "deployd-health"

// healthBacklog is the accept queue of a health listener: the agent has at
// most one probe in flight per worker.
const healthBacklog = 16

// HealthAddr is the address of a worker's health socket beside its notify
// socket at notifyAddr: "DIR/health" for a path (the notify socket's own
// folder, owned by the worker's user), "@.../health" for an abstract one.
// A next agent derives it from the notify socket it adopts.
func HealthAddr(notifyAddr string) string {
	if strings.HasPrefix(notifyAddr, "@") {
		return strings.TrimSuffix(notifyAddr, "/notify") + "/health"
	}
	return filepath.Join(filepath.Dir(notifyAddr), "health")
}

// ListenHealth binds and listens on a unix stream socket at addr ("@..." is
// abstract) for one worker's health checks, and returns it as a blocking
// file to pass to the worker (as every inherited listener, it is the
// worker's: the agent closes its copy once the worker started, and dials
// addr to probe). A path socket is bound with mode 0600 and then owned by
// uid (when uid >= 0 and the agent runs as another user), like the notify
// socket beside it, in a folder only root may write (ListenNotify); even
// so neither step follows a symlink at addr. The notify socket's Close
// removes its folder and so this socket too.
func ListenHealth(addr string, uid int) (*os.File, error) {
	return listenHealth(addr, uid, nil)
}

// listenHealth is ListenHealth; afterBind (tests) runs between the bind
// and the chown, where a user who could write the folder would strike.
func listenHealth(addr string, uid int, afterBind func()) (*os.File, error) {
	abstract := strings.HasPrefix(addr, "@")
	fd, err := bindUnix(unix.SOCK_STREAM, addr, 0o600)
	if err != nil {
		return nil, fmt.Errorf("health socket %s: %w", addr, err)
	}
	fail := func(what string, err error) (*os.File, error) {
		unix.Close(fd)
		if !abstract {
			os.Remove(addr)
		}
		return nil, fmt.Errorf("health socket %s: %s%w", addr, what, err)
	}
	if afterBind != nil {
		afterBind()
	}
	if !abstract {
		if err := ownSocket(addr, uid); err != nil {
			return fail("", err)
		}
	}
	if err := unix.Listen(fd, healthBacklog); err != nil {
		return fail("listen: ", err)
	}
	return os.NewFile(uintptr(fd), "health:"+addr), nil
}

// HealthPresent tells whether a health socket is bound at addr: how a next
// agent tells an adopted worker that got one from one that did not (it
// was started before health checks were configured). A symlink is not one
// (the agent would probe what it points to).
func HealthPresent(addr string) bool {
	if !strings.HasPrefix(addr, "@") {
		fi, err := os.Lstat(addr)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	}
	c, err := net.DialTimeout("unix", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
