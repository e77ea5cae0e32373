package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// server is one app server as its users run it under deployd.
type server struct {
	name     string
	apt      []string // Debian packages that bring it
	npm      bool     // needs integration/nodeapps installed
	probe    []string // runs when it is installed
	version  []string // prints its version (first line used)
	ready    string   // the app's ready key
	settings string   // what docs/compatibility.md says to set, shown in the table
	// argv and extra config lines; dir is the folder the app runs in.
	argv  func(h *harness) []string
	extra string
}

const python = "/usr/bin/python3" // Debian's, which sees the python3-* packages

func servers() []server {
	return []server{
		{
			name: "gunicorn (sync) + WSGI", apt: []string{"python3-gunicorn"},
			probe: []string{python, "-c", "import gunicorn"}, version: []string{python, "-c", "import gunicorn; print('gunicorn', gunicorn.__version__)"},
			ready: "notify", settings: "`--preload`, `--workers 1` per deployd worker",
			argv: func(*harness) []string {
				return []string{python, "-m", "gunicorn", "--workers", "1", "--preload", "wsgi:app"}
			},
		},
		{
			name: "gunicorn + uvicorn workers (ASGI)", apt: []string{"python3-gunicorn", "python3-uvicorn"},
			probe:   []string{python, "-c", "import gunicorn, uvicorn.workers"},
			version: []string{python, "-c", "import gunicorn, uvicorn; print('gunicorn %s, uvicorn %s' % (gunicorn.__version__, uvicorn.__version__))"},
			ready:   "notify", settings: "`-k uvicorn.workers.UvicornWorker --preload`",
			argv: func(*harness) []string {
				return []string{python, "-m", "gunicorn", "--workers", "1", "--preload", "-k", "uvicorn.workers.UvicornWorker", "asgi:app"}
			},
		},
		{
			name: "gunicorn + uvicorn workers + drain", apt: []string{"python3-gunicorn", "python3-uvicorn"},
			probe:   []string{python, "-c", "import gunicorn, uvicorn.workers"},
			version: []string{python, "-c", "import gunicorn, uvicorn; print('gunicorn %s, uvicorn %s' % (gunicorn.__version__, uvicorn.__version__))"},
			ready:   "notify", settings: "as above, the app wrapped in `deployd_uvicorn.drain(app)`",
			argv: func(*harness) []string {
				return []string{python, "-m", "gunicorn", "--workers", "1", "--preload", "-k", "uvicorn.workers.UvicornWorker", "asgi_drain:app"}
			},
		},
		{
			name: "uvicorn (ASGI)", apt: []string{"python3-uvicorn"},
			probe: []string{python, "-c", "import uvicorn"}, version: []string{python, "-c", "import uvicorn; print('uvicorn', uvicorn.__version__)"},
			ready: "log:Application startup complete", settings: "`--fd 3`; `tcp_nodelay` (default) matters",
			argv: func(*harness) []string {
				return []string{python, "-m", "uvicorn", "--fd", "3", "asgi:app"}
			},
		},
		{
			name: "uvicorn + drain", apt: []string{"python3-uvicorn"},
			probe: []string{python, "-c", "import uvicorn"}, version: []string{python, "-c", "import uvicorn; print('uvicorn', uvicorn.__version__)"},
			ready: "log:Application startup complete", settings: "as above, the app wrapped in `deployd_uvicorn.drain(app)`",
			argv: func(*harness) []string {
				return []string{python, "-m", "uvicorn", "--fd", "3", "asgi_drain:app"}
			},
		},
		{
			name: "Puma (Rack)", apt: []string{"puma", "ruby-sd-notify"},
			probe: []string{"ruby", "-e", `require "puma"; require "sd_notify"`}, version: []string{"puma", "--version"},
			ready: "notify", settings: "`--bind-to-activated-sockets only`, single mode",
			argv: func(*harness) []string {
				return []string{"puma", "--bind-to-activated-sockets", "only", "-t", "4:4", "config.ru"}
			},
		},
		{
			name: "Go net/http + package worker", probe: []string{"go", "version"}, version: []string{"go", "env", "GOVERSION"},
			ready: "notify", settings: "`worker.ServeHTTP(srv)`",
			argv: func(h *harness) []string { return []string{h.goapp} },
		},
		{
			name: "Node.js Express 5 (unmodified)", npm: true, version: []string{"node", "-p", `"node " + process.version`},
			ready: "notify", settings: "none (the Node.js integration: `listen(port)` as written)",
			argv: func(h *harness) []string { return []string{"node", filepath.Join(h.nodeDir, "express.js")} },
		},
	}
}

// available reports whether s runs here; with install it first tries
// apt-get (or npm ci) for what is missing. why says what is missing.
func (h *harness) available(s *server) (ok bool, why string) {
	if s.npm {
		return h.nodeReady()
	}
	if run(s.probe) == nil {
		return true, ""
	}
	if h.install && len(s.apt) > 0 {
		h.aptInstall(s.apt)
		if run(s.probe) == nil {
			return true, ""
		}
	}
	if len(s.apt) > 0 {
		return false, "not installed (`apt-get install " + strings.Join(s.apt, " ") + "`, or run with -install)"
	}
	return false, "not found: " + strings.Join(s.probe, " ")
}

// nodeReady links express5 from integration/nodeapps as the harness's
// node_modules/express.
func (h *harness) nodeReady() (bool, string) {
	mods := filepath.Join(h.root, "integration", "nodeapps", "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "express5")); err != nil && h.install {
		_ = run([]string{"npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", filepath.Join(h.root, "integration", "nodeapps")})
	}
	if _, err := exec.LookPath("node"); err != nil {
		return false, "node not found"
	}
	if _, err := os.Stat(filepath.Join(mods, "express5")); err != nil {
		return false, "Express not installed (`npm ci --prefix integration/nodeapps`, or run with -install)"
	}
	h.nodeDir = filepath.Join(h.dir, "node")
	_ = os.MkdirAll(filepath.Join(h.nodeDir, "node_modules"), 0o755)
	_ = os.Symlink(filepath.Join(mods, "express5"), filepath.Join(h.nodeDir, "node_modules", "express"))
	return true, ""
}

// run runs argv quietly and reports its error.
func run(argv []string) error {
	return exec.Command(argv[0], argv[1:]...).Run()
}

// versionOf is the first line argv prints.
func versionOf(argv []string) string {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
