// Command testapp is the HTTP app that deployd's integration tests and benchmarks run as a
// worker. It speaks the worker contract (docs: "The worker contract") through the
// libraries a real Go app would use, and its flags make it misbehave on purpose.
//
// It uses package worker, as a Go app under deployd would: worker.Listeners for the
// inherited sockets, worker.NewServer and Drain on SIGTERM (plain http.Server.Shutdown
// drops a request that arrives on a connection accepted just before the shutdown, and
// closes idle keep-alive connections at once; see worker/drain.go). Each step is marked
// "contract:" below. An app without this one's knobs needs only worker.ServeHTTP.
//
// Exit codes: 0 after a graceful stop, 1 on a crash or failure, 2 on bad flags, 3 when it
// was given no listener, or the -exit-before-ready code.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/deployd/deployd/worker"
)

const (
	exitFailure    = 1
	exitUsage      = 2
	exitNoListener = 3

	// shutdownTimeout bounds the drain after SIGTERM; deployd's stop_timeout is the
	// outer bound (SIGKILL to the process group).
	shutdownTimeout = 30 * time.Second
)

func main() {
	switch os.Getenv(roleEnv) {
	case roleNotifyChild:
		os.Exit(runNotifyChild())
	case roleDaemon:
		os.Exit(runDaemon())
	}
	os.Exit(run(os.Args[1:]))
}

// run is the whole life of the app; it returns the exit code.
func run(args []string) int {
	cfg, err := parseConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		warnf("%v", err)
		return exitUsage
	}
	// Subscribe before anything else so a SIGTERM during startup is not fatal.
	stop := watchSignals(cfg.ignoreSIGTERM)

	if cfg.daemonDir != "" {
		if err := startDaemon(cfg); err != nil {
			warnf("%v", err)
			return exitFailure
		}
	}
	listeners, err := takeListeners(cfg.listen)
	if err != nil {
		warnf("%v", err)
		return exitNoListener
	}
	a := newApp(cfg)
	a.out.printf("started version=%s pid=%d slot=%s addr=%s\n", cfg.version, a.pid, a.slot, addrs(listeners))

	select {
	case <-time.After(cfg.startupDelay):
	case <-stop:
		warnf("stopped during startup")
		return 0
	}
	if cfg.readyFile != "" && !waitForFile(cfg.readyFile, stop) {
		warnf("stopped while waiting for %s", cfg.readyFile)
		return 0
	}
	if cfg.exitBeforeReady >= 0 {
		warnf("exiting with %d before ready (-exit-before-ready)", cfg.exitBeforeReady)
		return cfg.exitBeforeReady
	}

	// contract: every inherited listener is served, the health listener
	// (LISTEN_FDNAMES "deployd-health") too.
	a.serving = time.Now()
	srv := worker.NewServer(&http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second})
	srv.Serve(listeners)

	if cfg.neverReady || (cfg.neverReadySlot != "" && cfg.neverReadySlot == a.slot) {
		warnf("serving but never signalling readiness (-never-ready, -never-ready-slot)")
	} else {
		a.signalReady()
		a.startWatchdog()
	}
	if cfg.crashAfter > 0 {
		time.AfterFunc(cfg.crashAfter, func() {
			warnf("exiting with %d %v after ready (-crash-after)", cfg.crashCode, cfg.crashAfter)
			os.Exit(cfg.crashCode)
		})
	}
	a.writeLines("line", cfg.logSpam, stop)
	if cfg.tick > 0 {
		go a.ticks(cfg.tick, stop)
	}

	<-stop
	if cfg.stopDelay > 0 {
		warnf("serving on for %v before stopping (-stop-delay)", cfg.stopDelay)
		time.Sleep(cfg.stopDelay)
	}
	if cfg.abruptSIGTERM {
		warnf("exiting at once (-abrupt-sigterm)")
		return 0
	}
	return a.shutdown(srv)
}

// takeListeners returns the listeners passed by socket activation or, when none were
// passed, one listening on addr.
func takeListeners(addr string) ([]net.Listener, error) {
	fds, pid := os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_PID")
	// contract: fds 3..3+LISTEN_FDS-1, valid only if LISTEN_PID is our own pid.
	// Listeners unsets LISTEN_* so children of this process do not take them too.
	ls, err := worker.Listeners()
	if err != nil {
		return nil, fmt.Errorf("no listener: %w", err)
	}
	switch {
	case len(ls) > 0:
		return ls, nil
	case addr == "":
		return nil, fmt.Errorf("no listener: LISTEN_FDS=%q LISTEN_PID=%q (this pid is %d) and no -listen ADDR",
			fds, pid, os.Getpid())
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("no listener: %w", err)
	}
	return []net.Listener{l}, nil
}

func addrs(ls []net.Listener) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.Addr().String()
	}
	return strings.Join(s, ",")
}

// watchSignals returns a channel closed at the first SIGTERM or SIGINT; with ignoreTERM,
// SIGTERM is only reported on stderr. The watching goroutine lives as long as the process.
func watchSignals(ignoreTERM bool) <-chan struct{} {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	stop := make(chan struct{})
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGTERM && ignoreTERM {
				warnf("ignoring SIGTERM (-ignore-sigterm)")
				continue
			}
			warnf("received %v", sig)
			close(stop)
			return
		}
	}()
	return stop
}

// shutdown is the contract's stop: refuse new connections, finish in-flight requests
// (keep-alive clients get Connection: close), then exit.
func (a *app) shutdown(srv *worker.Server) int {
	a.notify("STOPPING=1")
	warnf("stopping version=%s pid=%d slot=%s", a.cfg.version, a.pid, a.slot)
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Drain(ctx); err != nil {
		warnf("shutdown: %v", err)
		return exitFailure
	}
	warnf("stopped version=%s pid=%d slot=%s", a.cfg.version, a.pid, a.slot)
	return 0
}

// warnf writes one line to stderr.
func warnf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testapp: "+format+"\n", args...)
}

// waitForFile waits until path exists (a test creates it to let the worker
// get ready); false when a stop signal came first.
func waitForFile(path string, stop <-chan struct{}) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		select {
		case <-tick.C:
		case <-stop:
			return false
		}
	}
}
