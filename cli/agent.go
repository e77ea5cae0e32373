package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/agent/control"
	"github.com/deployd/deployd/workers/logs"
)

var logFlags = []cli.Flag{
	&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"DEPLOYD_LOG_LEVEL"},
		Usage: "agent log level: trace, debug, info, warn, error"},
	&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"DEPLOYD_LOG_FORMAT"},
		Usage: "agent log format: text or json"},
}

func newLogger(c *cli.Context) (hclog.Logger, error) {
	level := hclog.LevelFromString(c.String("log-level"))
	if level == hclog.NoLevel {
		return nil, fail(ExitUsage, "--log-level %q: use trace, debug, info, warn or error", c.String("log-level"))
	}
	format := c.String("log-format")
	if format != "text" && format != "json" {
		return nil, fail(ExitUsage, "--log-format %q: use text or json", format)
	}
	out := c.App.ErrWriter
	// Under systemd, with stderr the journal's: one structured entry per
	// line (docs/logs.md), written as JSON for the journal writer to read.
	if w, ok := logs.JournalLogOutput(out); ok && format == "text" {
		out, format = w, "json"
	}
	return hclog.New(&hclog.LoggerOptions{
		Name: "deployd", Level: level, JSONFormat: format == "json", Output: out,
		TimeFormat: "2006-01-02T15:04:05.000Z07:00",
	}), nil
}

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "run the agent in the foreground (as systemd or a container runs it)",
		Description: "Loads the config, opens every app's listeners (a busy port is an error, exit 2),\n" +
			"starts the workers and serves the control socket until SIGTERM, SIGINT or\n" +
			"`deployd shutdown`, then stops every worker gracefully and exits 0.\n" +
			"SIGHUP hands every socket to a new agent started from the binary at its path;\n" +
			"SIGUSR1 reopens (rotates) the log files.\n\n" +
			"Example: deployd agent -c /etc/deployd/deployd.toml",
		Flags: append([]cli.Flag{configFlag,
			&cli.StringFlag{Name: "socket", EnvVars: []string{"DEPLOYD_SOCKET"},
				Usage: "control socket `PATH` (overrides [agent] socket)"},
		}, logFlags...),
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			return runAgent(agent.Options{
				ConfigPath: config.Find(c.String("config")), Socket: c.String("socket"), Logger: log, Edge: control.New,
			})
		},
	}
}

func runAgent(opts agent.Options) error {
	return agentError(agent.Run(opts))
}

// agentError maps agent.Run's outcome to an exit code.
func agentError(err error) error {
	if errors.Is(err, agent.ErrHandedOff) {
		return nil
	}
	var se *agent.SetupError
	if errors.As(err, &se) {
		return fail(ExitUsage, "%v", se.Err)
	}
	if err != nil {
		return fail(ExitFailed, "%v", err)
	}
	return nil
}

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "work with the config file",
		Subcommands: []*cli.Command{{
			Name:  "check",
			Usage: "validate the config file and print what it resolves to",
			Description: "Reports every problem with its file, line, key and a fix; exit 2 when\n" +
				"there is one. Warnings (exit 0) are settings that probably do not do what you\n" +
				"mean; for an app with health checks it says which fd the health listener is\n" +
				"and warns when the command looks like it serves only fd 3. When an agent answers\n" +
				"on the socket, it also says which apps run a count `deployd scale` set instead of\n" +
				"their instances. It refuses a state_dir, log_dir or env_file whose path has a\n" +
				"symbolic link or a folder that anyone but root (or the agent's user) could change:\n" +
				"the agent reads and writes there as root.\n" +
				"Example: deployd config check -c /etc/deployd/deployd.toml",
			Flags: []cli.Flag{configFlag, socketFlag},
			Action: func(c *cli.Context) error {
				path := config.Find(c.String("config"))
				cfg, err := config.Load(path)
				if err != nil {
					return fail(ExitUsage, "%v", err)
				}
				w := c.App.Writer
				scaled := scaledCounts(c, cfg.Path)
				fmt.Fprintf(w, "%s: ok\n  socket    %s\n  state_dir %s\n  log_dir   %s\n",
					cfg.Path, cfg.Agent.Socket, cfg.Agent.StateDir, cfg.Agent.LogDir)
				for _, n := range cfg.AppNames {
					a := cfg.Apps[n]
					var ls []string
					for _, l := range a.Listen {
						ls = append(ls, l.URL)
					}
					switch {
					case a.DiscoversListen():
						ls = []string{"discovered at its first bind (the address the app's own listen(port) binds, if the address policy allows it; deployd answers that bind with its socket)"}
					case len(ls) == 0:
						ls = []string{"none"}
					}
					fmt.Fprintf(w, "  app %s: %d workers of %s, listen %s, ready %s, min_ready %s, tcp_nodelay %t, node %s, sockets %s\n",
						n, a.Instances, strings.Join(a.Command, " "), strings.Join(ls, " "), a.Ready.Raw,
						a.MinReady, a.TCPNoDelay, nodeMode(a), a.SocketSource())
					if a.Environment != "" {
						fmt.Fprintf(w, "    environment %s: the variables of [apps.%s.env_%s] over env\n", a.Environment, n, a.Environment)
					}
					if m := scaled[n]; m > 0 && m != a.Instances {
						fmt.Fprintf(w, "    note: %s: %s\n", n, api.ScaledMessage(n, m, a.Instances))
					}
					if h := a.Health; h != nil {
						fmt.Fprintf(w, "    health: GET %s every %s, timeout %s, replaced after %d failures in a row\n",
							h.Path, h.Interval, h.Timeout, h.Failures)
					}
					if note := releasesListenNote(n, a); note != "" {
						fmt.Fprintf(w, "    note: %s\n", note)
					}
					if note := a.HealthNote(); note != "" {
						fmt.Fprintf(w, "    note: %s\n", note)
					}
				}
				for _, p := range cfg.Warnings {
					fmt.Fprintf(c.App.ErrWriter, "deployd: warning: %s\n", p)
				}
				return nil
			},
		}},
	}
}

// scaledCounts asks the agent, briefly, which apps run a count `deployd
// scale` set; nil when no agent answers (config check works without one)
// or it runs another config file.
func scaledCounts(c *cli.Context, path string) map[string]int {
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	defer cancel()
	st, err := client(c).Status(cx, "")
	if err != nil || !sameFile(st.Agent.Config, path) {
		return nil
	}
	out := map[string]int{}
	for _, a := range st.Apps {
		out[a.Name] = a.Scaled
	}
	return out
}

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "run the agent on its built-in hello app (try deployd in one command)",
		Description: "Writes a config for a built-in hello app (this binary in a hidden worker mode,\n" +
			"speaking the worker contract) and runs the agent on it in the foreground:\n" +
			"one worker per core on 127.0.0.1:8080. Each answer names the worker's pid and\n" +
			"version, so you can watch `deployd reload` replace them. Ctrl-C stops it.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "`HOST:PORT` to serve the demo app on"},
			&cli.StringFlag{Name: "instances", Value: "max", Usage: `workers: "max" (one per core), N, or -N`},
			&cli.StringFlag{Name: "dir", Usage: "folder for the demo's config, state and logs (default: a new temporary folder)"},
			&cli.StringFlag{Name: "socket", EnvVars: []string{"DEPLOYD_SOCKET"},
				Usage: "control socket `PATH` (default " + config.DefaultSocket() + ")"},
		}, logFlags...),
		Action: runDemo,
	}
}

func runDemo(c *cli.Context) error {
	handedOff := false
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fail(ExitFailed, "find own binary: %v", err)
	}
	// An agent that took over from a demo agent (deployd upgrade, SIGHUP)
	// finds the demo's folder in the environment it inherited.
	dir, reused := c.String("dir"), false
	if dir == "" {
		if dir = os.Getenv(demoDirEnv); dir != "" {
			reused = true
		} else if dir, err = os.MkdirTemp("", "deployd-demo-"); err != nil {
			return fail(ExitFailed, "%v", err)
		}
		os.Setenv(demoDirEnv, dir)
		defer func() {
			if !handedOff {
				os.RemoveAll(dir)
			}
		}()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(ExitFailed, "demo folder: %v", err)
	}
	sock := c.String("socket")
	if sock == "" {
		sock = config.DefaultSocket()
	}
	cfgPath := filepath.Join(dir, "deployd.toml")
	body := fmt.Sprintf(`# written by deployd demo
[agent]
socket    = %q
state_dir = "state"
log_dir   = "logs"

[apps.hello]
command   = [%q, "demo-worker"]
instances = %q
listen    = ["tcp://%s"]
ready     = "notify"
ready_timeout = "10s"
stop_timeout  = "10s"
`, sock, self, c.String("instances"), c.String("listen"))
	if _, err := os.Stat(cfgPath); err != nil || !reused {
		if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
			return fail(ExitFailed, "write demo config: %v", err)
		}
	}
	hint := ""
	if c.String("socket") != "" {
		hint = " --socket " + sock
	}
	cmd, note := demoCLI(self)
	err = agent.Run(agent.Options{ConfigPath: cfgPath, Logger: log, Edge: control.New, Ready: func(a *agent.Agent) {
		n := a.AppConfig("hello").Instances
		fmt.Fprintf(c.App.Writer, `
deployd demo is serving http://%[1]s/ with %[2]d workers (config: %[3]s).
%[6]sTry, in another terminal:
  curl http://%[1]s/       # answered by one of the workers
  %[5]s status%[4]s      # workers, pids, CPU, memory
  %[5]s reload%[4]s      # rolling reload: new pids, zero failed requests
  kill -9 <a worker pid>; %[5]s status%[4]s   # the worker is restarted
Stop with Ctrl-C (or %[5]s shutdown%[4]s).

`, c.String("listen"), n, cfgPath, hint, cmd, note)
	}})
	handedOff = errors.Is(err, agent.ErrHandedOff)
	return agentError(err)
}

// demoCLI is how the user can run this binary from another terminal:
// "deployd" when that name on PATH is this binary, else its full path (under
// `go run` the binary is a temporary file, so the go run form is given too).
func demoCLI(self string) (cmd, note string) {
	if p, err := exec.LookPath("deployd"); err == nil && sameFile(p, self) {
		return "deployd", ""
	}
	if strings.Contains(self, string(filepath.Separator)+"go-build") {
		return "go run ./cmd/deployd", "(deployd is not on your PATH: the commands below use `go run ./cmd/deployd`\n" +
			"from this folder; `go build -o deployd ./cmd/deployd` makes a binary you can keep.)\n"
	}
	return self, "(deployd is not on your PATH: the commands below use this binary's full path.)\n"
}

func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// demoDirEnv passes the demo's folder to an agent that takes over.
const demoDirEnv = "DEPLOYD_DEMO_DIR"
