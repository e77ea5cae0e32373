// Command goshutdown is a Go server as most are written: net/http with
// http.Server.Shutdown on SIGTERM, and no deployd code. It serves the
// listener it inherits at fd 3 (systemd socket activation, as go-systemd's
// activation.Listeners gives it); its answer names its version
// (GOAPP_VERSION), pid and slot as the load generator expects. The
// integration tests of the quiet stop run it.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if os.Getenv("LISTEN_FDS") != "1" {
		log.Fatal("goshutdown: want one listener at fd 3 (LISTEN_FDS=1)")
	}
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		log.Fatal(err)
	}
	ver, pid, slot := os.Getenv("GOAPP_VERSION"), os.Getpid(), os.Getenv("DEPLOYD_WORKER")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "version=%s pid=%d slot=%s\n", ver, pid, slot)
	})}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Print(err)
		}
	}()
	log.Print("serving")
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	<-done
}
