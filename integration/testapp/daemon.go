package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
)

// roleDaemon marks the re-executed child of -daemon-dir.
const roleDaemon = "daemon"

// startDaemon starts this binary again as a daemon that leaves the worker's
// process group and session (setsid), as a daemonizing library would, with
// a copy of the first inherited listener at fd 3 and the worker's stdout.
// It does not wait for it.
func startDaemon(cfg config) error {
	if os.Getenv("LISTEN_FDS") == "" {
		return errors.New("-daemon-dir: no inherited listener (LISTEN_FDS) to pass on")
	}
	fd, err := syscall.Dup(3)
	if err != nil {
		return fmt.Errorf("-daemon-dir: dup fd 3: %w", err)
	}
	l := os.NewFile(uintptr(fd), "listener")
	defer l.Close()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("-daemon-dir: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"="+roleDaemon, "TESTAPP_DAEMON_VERSION="+cfg.version,
		"TESTAPP_DAEMON_DIR_="+cfg.daemonDir)
	if cfg.daemonNoTERM {
		cmd.Env = append(cmd.Env, "TESTAPP_DAEMON_NO_TERM_=1")
	}
	cmd.ExtraFiles = []*os.File{l}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("-daemon-dir: %w", err)
	}
	fmt.Printf("daemon started pid=%d\n", cmd.Process.Pid)
	return cmd.Process.Release()
}

// runDaemon is the daemon's whole life: it serves on fd 3 until killed
// (with -daemon-ignore-sigterm, by SIGKILL).
func runDaemon() int {
	dir, ver := os.Getenv("TESTAPP_DAEMON_DIR_"), os.Getenv("TESTAPP_DAEMON_VERSION")
	if os.Getenv("TESTAPP_DAEMON_NO_TERM_") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	l, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		warnf("daemon %d: %v", os.Getpid(), err)
		return exitFailure
	}
	pid := strconv.Itoa(os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, pid), []byte(pid), 0o644); err != nil {
		warnf("daemon %d: %v", os.Getpid(), err)
		return exitFailure
	}
	err = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "version=%s-daemon pid=%s\n", ver, pid)
	}))
	warnf("daemon %d: %v", os.Getpid(), err)
	return exitFailure
}
