// Package demoapp is the hello app that `deployd demo` runs: the deployd
// binary in a hidden worker mode. It is also the smallest example of the
// worker contract in Go: take the inherited listeners, say READY=1, drain
// on SIGTERM (without dropping a request: package worker).
package demoapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/worker"
)

// Run serves until SIGTERM or SIGINT, then finishes in-flight requests.
func Run(stdout io.Writer) error {
	listeners, err := worker.Listeners()
	if err != nil {
		return err
	}
	if len(listeners) == 0 {
		return errors.New("no inherited listener: run me through `deployd demo` (LISTEN_FDS is not set)")
	}
	slot, pid := os.Getenv("DEPLOYD_WORKER"), os.Getpid()
	srv := worker.NewServer(&http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from deployd demo worker %s (pid %d, version %s, release %s)\n",
				slot, pid, version.String(), os.Getenv("DEPLOYD_RELEASE"))
		}),
	})
	srv.Serve(listeners)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	_, _ = worker.Ready()
	fmt.Fprintf(stdout, "demo worker %s ready, pid %d\n", slot, pid)
	<-sigs
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
	return srv.Drain(ctx)
}
