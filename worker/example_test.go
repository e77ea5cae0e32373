package worker_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/deployd/deployd/worker"
)

// An app's main under deployd: serve the inherited listeners, report
// ready, drain on SIGTERM. Run by hand, it listens on srv.Addr.
func ExampleServeHTTP() {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	if err := worker.ServeHTTP(srv); err != nil {
		log.Fatal(err)
	}
}

// An app that serves something other than HTTP takes the listeners and
// reports readiness itself.
func ExampleListeners() {
	ls, err := worker.Listeners()
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	if _, err := worker.Ready(); err != nil {
		log.Fatal(err)
	}
}
