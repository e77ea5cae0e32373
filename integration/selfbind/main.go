// Command selfbind is a Go server as most are written: it binds its own
// port (http.Server{Addr: ":PORT"}.ListenAndServe) and calls Shutdown on
// SIGTERM, with no deployd code. deployd answers its bind with the agent's
// socket (handoff/bindtrap). Its answer names its version (APP_VERSION),
// pid and slot as the load generator expects.
//
// For the bind trap's own tests it can also bind what the trap must leave
// alone first: EXTRA_TCP=PORT (a TCP port no listen names) and UDP=1 (a
// UDP socket on PORT); it prints each outcome as a line. WAIT_STDIN=1
// makes it bind only once a line comes on stdin, and SIGHUP binds PORT
// once more.
package main

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
)

func main() {
	port := os.Getenv("PORT")
	ver, pid, slot := os.Getenv("APP_VERSION"), os.Getpid(), os.Getenv("DEPLOYD_WORKER")
	if p := os.Getenv("EXTRA_TCP"); p != "" {
		l, err := net.Listen("tcp", "127.0.0.1:"+p)
		report("extra-tcp", l, err)
	}
	if os.Getenv("UDP") == "1" {
		c, err := net.ListenPacket("udp", ":"+port)
		if err == nil {
			fmt.Printf("udp ok %s\n", c.LocalAddr())
		} else {
			fmt.Printf("udp err %v\n", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "version=%s pid=%d slot=%s\n", ver, pid, slot)
	})
	srv := &http.Server{Addr: ":" + port, Handler: mux}
	go rebindOnHUP(srv, port)
	idle := make(chan struct{})
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		close(idle)
	}()
	if os.Getenv("WAIT_STDIN") == "1" { // bind when a line comes
		fmt.Println("waiting")
		_, _ = fmt.Scanln()
	}
	fmt.Println("listening on :" + port)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "selfbind:", err)
		os.Exit(1)
	}
	<-idle
}

func report(what string, l net.Listener, err error) {
	if err != nil {
		fmt.Printf("%s err %v\n", what, err)
		return
	}
	fmt.Printf("%s ok %s\n", what, l.Addr())
}

// rebindOnHUP binds PORT once more on each SIGHUP and serves there too,
// saying "rebound ok PID" or "rebound err PID ERROR": the bind trap's
// tests make a worker bind while no agent runs, or under the next agent.
func rebindOnHUP(srv *http.Server, port string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	for range hup {
		l, err := net.Listen("tcp", ":"+port)
		if err != nil {
			fmt.Printf("rebound err %d %v\n", os.Getpid(), err)
			continue
		}
		fmt.Printf("rebound ok %d\n", os.Getpid())
		go func() { _ = srv.Serve(l) }()
	}
}
