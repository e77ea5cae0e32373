// Package worker is what a Go app needs to run under deployd (or systemd)
// without dropping a request: the inherited listeners, readiness, and a
// drain that loses nothing. The whole of it, in an app's main:
//
//	srv := &http.Server{Handler: mux}
//	if err := worker.ServeHTTP(srv); err != nil {
//		log.Fatal(err)
//	}
//
// ServeHTTP takes the listeners deployd passed (LISTEN_FDS, or srv.Addr when
// run by hand), serves them, reports READY=1 on NOTIFY_SOCKET, and on SIGTERM
// or SIGINT stops accepting, answers every later request with
// "Connection: close" and closes an idle keep-alive connection only after it
// stayed idle for IdleGrace, then returns. Listeners, Ready and NewServer
// are its parts, for apps that need them apart.
//
// Health checks (ready = "http:PATH", [apps.NAME.health]) need nothing
// more: deployd passes each worker a private health listener as the last
// inherited fd (named "deployd-health" in LISTEN_FDNAMES), which Listeners
// returns with the others, so ServeHTTP answers the agent's health checks
// with srv's own handler. An app that serves only Listeners()[0] does not.
//
// This package is imported by apps; it is not the agent's pool of worker
// processes, which is the internal package workers.
package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
)

// DrainTimeout bounds ServeHTTP's drain; keep deployd's stop_timeout above
// it (after stop_timeout the worker gets SIGKILL).
var DrainTimeout = 25 * time.Second

// Listeners returns the stream listeners deployd passed (fds 3.. as
// LISTEN_FDS says, checked against LISTEN_PID), in the config's listen
// order, then the health listener when the app has health checks, and
// unsets LISTEN_* so children do not take them. Serve them all. None when
// the process was not started by deployd or systemd.
func Listeners() ([]net.Listener, error) {
	inherited, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("worker: inherited listeners: %w", err)
	}
	ls := make([]net.Listener, 0, len(inherited))
	for i, l := range inherited {
		if l == nil {
			return nil, fmt.Errorf("worker: inherited fd %d is not a stream listener", 3+i)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// Ready tells deployd the worker serves (READY=1 on NOTIFY_SOCKET, for
// ready = "notify"). It reports false, without error, when NOTIFY_SOCKET is
// not set (run by hand).
func Ready() (bool, error) {
	return daemon.SdNotify(false, daemon.SdNotifyReady)
}

// ServeHTTP serves srv on the inherited listeners (or on srv.Addr when
// there are none), reports ready, and drains on SIGTERM or SIGINT; it
// returns nil after a complete drain.
func ServeHTTP(srv *http.Server) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ls, err := Listeners()
	if err != nil {
		return err
	}
	if len(ls) == 0 {
		if srv.Addr == "" {
			return errors.New("worker: no inherited listener (LISTEN_FDS is not set) and no http.Server.Addr")
		}
		l, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		ls = append(ls, l)
	}
	s := NewServer(srv)
	s.Serve(ls)
	if _, err := Ready(); err != nil {
		return fmt.Errorf("worker: sd_notify READY=1: %w", err)
	}
	<-sigs
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	ctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		return fmt.Errorf("worker: drain: %w", err)
	}
	return nil
}
