// Command compat is the compatibility harness: it runs real app servers
// (gunicorn, gunicorn with uvicorn workers and uvicorn, each of those two
// also with integration/appservers/deployd_uvicorn.py's drain, Puma, a Go
// app on package worker, an unmodified Express app) under deployd, each with 2
// workers, through 5 reloads and 1 agent upgrade under two loads at once
// (keep-alive clients and one-connection-per-request clients), and prints a
// Markdown table of the failed requests; on stderr, which load lost the
// failed requests of each reload and how. A server that is not installed is
// skipped with a line saying so (with -install it first tries apt-get and
// npm), never counted as passing.
//
//	go run ./integration/compat [-install] [-reloads 5] [-clients 20] [-only NAME]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/deployd/deployd/integration"
)

// harness holds what every server's run shares.
type harness struct {
	root, dir        string
	deployd, deploy2 string // the agent and the upgrade candidate
	goapp            string
	nodeDir          string
	install          bool
	reloads, clients int
	aptOnce          sync.Once
}

func main() {
	h := &harness{root: integration.RepoRoot()}
	flag.BoolVar(&h.install, "install", false, "install missing servers with apt-get (and npm ci for Express) first")
	flag.IntVar(&h.reloads, "reloads", 5, "reloads per server")
	flag.IntVar(&h.clients, "clients", 20, "clients of each load (keep-alive and new-connection)")
	only := flag.String("only", "", "run only the servers whose name contains this")
	flag.Parse()
	if err := h.main(*only); err != nil {
		fmt.Fprintln(os.Stderr, "compat:", err)
		os.Exit(1)
	}
}

func (h *harness) main(only string) error {
	var err error
	if h.dir, err = os.MkdirTemp("", "deployd-compat-"); err != nil {
		return err
	}
	defer os.RemoveAll(h.dir)
	if err := os.Chmod(h.dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "compat: building deployd and the Go app")
	if h.deployd, err = integration.Build(h.dir, "deployd", "./cmd/deployd", "compat-1"); err == nil {
		if h.deploy2, err = integration.Build(h.dir, "deployd-v2", "./cmd/deployd", "compat-2"); err == nil {
			h.goapp, err = integration.Build(h.dir, "goapp", "./integration/goapp", "")
		}
	}
	if err != nil {
		return err
	}
	var rows []string
	for _, s := range servers() {
		if only != "" && !strings.Contains(strings.ToLower(s.name), strings.ToLower(only)) {
			continue
		}
		if ok, why := h.available(&s); !ok {
			fmt.Fprintf(os.Stderr, "compat: SKIPPED %s: %s\n", s.name, why)
			rows = append(rows, fmt.Sprintf("| %s | - | %s | %s | skipped: %s | | |", s.name, s.ready, s.settings, why))
			continue
		}
		fmt.Fprintf(os.Stderr, "compat: %s\n", s.name)
		r := h.runServer(&s)
		rows = append(rows, r.row(&s, versionOf(s.version)))
		fmt.Fprintf(os.Stderr, "compat: %s: %s\n", s.name, r.summary())
	}
	fmt.Printf("%d workers each, %d reloads and 1 agent upgrade under %d keep-alive + %d new-connection clients (%s, %d CPUs):\n\n",
		workers, h.reloads, h.clients, h.clients, runtime.GOOS, runtime.NumCPU())
	fmt.Println("| server | version | ready | settings | failed requests per reload | failed in the upgrade | keep-alive p50 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
	return nil
}

// aptInstall installs pkgs (running apt-get update once first).
func (h *harness) aptInstall(pkgs []string) {
	h.aptOnce.Do(func() { _ = run([]string{"apt-get", "update", "-qq"}) })
	argv := append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	fmt.Fprintf(os.Stderr, "compat: %s\n", strings.Join(argv, " "))
	cmd := execCommand(argv)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "compat: apt-get: %v\n%s\n", err, out)
	}
}

// appDir is where the Python and Ruby apps are.
func (h *harness) appDir() string { return filepath.Join(h.root, "integration", "appservers") }
