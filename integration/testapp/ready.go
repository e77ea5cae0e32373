package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// roleEnv marks the re-executed child of -notify-from-child.
const (
	roleEnv         = "TESTAPP_ROLE"
	roleNotifyChild = "notify-child"
)

// signalReady tells deployd the worker serves, in the way -ready names. Failures are
// reported on stderr, not fatal: deployd then never sees the worker ready and abandons it,
// which is what a test of a broken app wants to observe.
func (a *app) signalReady() {
	switch a.cfg.ready {
	case "notify":
		if a.cfg.notifyFromChild {
			if err := notifyFromChild(); err != nil {
				warnf("%v", err)
			}
			return
		}
		// contract: READY=1 on NOTIFY_SOCKET; STATUS= is optional free text.
		if !a.notify("READY=1\nSTATUS=serving version=" + a.cfg.version) {
			warnf("NOTIFY_SOCKET is not set: READY=1 not sent")
		}
	case "node-ipc":
		if err := a.sendNodeReady(); err != nil {
			warnf("%v", err)
		}
	case "log":
		a.out.printf("listening ready version=%s\n", a.cfg.version)
	case "delay":
		// deployd only checks that the worker stays alive for a while.
	}
}

// notify sends one sd_notify message if NOTIFY_SOCKET is set and reports whether it was
// sent. NOTIFY_SOCKET stays in the environment for STOPPING=1 and for children.
func (a *app) notify(state string) bool {
	sent, err := daemon.SdNotify(false, state)
	if err != nil {
		warnf("sd_notify: %v", err)
	}
	return sent
}

// sendNodeReady writes what Node's process.send('ready') writes on its IPC channel: one
// JSON value and a newline on the fd named by NODE_CHANNEL_FD (the default "json"
// serialization; PM2's wait_ready listens for exactly this).
func (a *app) sendNodeReady() error {
	v := os.Getenv("NODE_CHANNEL_FD")
	if v == "" {
		return fmt.Errorf("NODE_CHANNEL_FD is not set: \"ready\" not sent")
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 0 {
		return fmt.Errorf("NODE_CHANNEL_FD=%q: not an fd", v)
	}
	os.Unsetenv("NODE_CHANNEL_FD") // as Node does: the channel is not for our children
	syscall.CloseOnExec(fd)
	a.nodeChannel = os.NewFile(uintptr(fd), "node-channel")
	if _, err := a.nodeChannel.Write([]byte("\"ready\"\n")); err != nil {
		return fmt.Errorf("node channel: %w", err)
	}
	return nil
}

// notifyFromChild re-executes this binary as a child that sends READY=1 and exits, the
// way a wrapper script's `systemd-notify --ready` would. The child exits right after
// sending and is reaped at once, so whoever attributes the message by the sender's pid
// must look the sender up promptly (or give each worker its own socket).
func notifyFromChild() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("notify from child: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"="+roleNotifyChild)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("notify from child: %w", err)
	}
	return nil
}

// runNotifyChild is the child's whole life; it returns the exit code.
func runNotifyChild() int {
	sent, err := daemon.SdNotify(true, "READY=1")
	switch {
	case err != nil:
		warnf("child %d: sd_notify: %v", os.Getpid(), err)
		return exitFailure
	case !sent:
		warnf("child %d: NOTIFY_SOCKET is not set: READY=1 not sent", os.Getpid())
		return exitFailure
	}
	return 0
}

// startWatchdog sends WATCHDOG=1 at half the interval in WATCHDOG_USEC, as
// sd_notify's watchdog protocol asks, for as long as the process runs (a
// SIGSTOPped worker goes silent, which is what the watchdog catches).
func (a *app) startWatchdog() {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return
	}
	go func() {
		t := time.NewTicker(time.Duration(usec) * time.Microsecond / 2)
		for range t.C {
			a.notify("WATCHDOG=1")
		}
	}()
}
