// Command goapp is the Go guide's example (docs/go.md): an app that runs under deployd
// through package worker alone. The compatibility harness and the
// integration tests run it; its answer names its version (GOAPP_VERSION),
// pid and slot as the load generator expects.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/deployd/deployd/worker"
)

func main() {
	ver, pid, slot := os.Getenv("GOAPP_VERSION"), os.Getpid(), os.Getenv("DEPLOYD_WORKER")
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "version=%s pid=%d slot=%s\n", ver, pid, slot)
	})

	srv := &http.Server{Handler: mux}
	if err := worker.ServeHTTP(srv); err != nil {
		log.Fatal(err)
	}
}
