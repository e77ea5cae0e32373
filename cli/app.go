// Package cli is deployd's command line: commands, flags, output (tables,
// progress, --json) and exit codes. It talks to the agent only through the
// control client in agent/api.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/version"
)

// Exit codes of every command.
// The table that maps an agent's answer to one is api.Kind's (agent/api/outcome.go).
const (
	ExitOK          = api.ExitOK
	ExitFailed      = api.ExitFailed      // the operation failed (e.g. reload abandoned)
	ExitUsage       = api.ExitUsage       // usage or config error
	ExitUnreachable = api.ExitUnreachable // the agent cannot be reached
)

// exitError carries an exit code and a message already meant for the user.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// Main runs the CLI with args (os.Args) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	app.Metadata = map[string]any{"args": args} // as typed: deployd start writes it in the config
	err := app.Run(interspersed(app, helpAsFlag(app, args)))
	if err == nil {
		return ExitOK
	}
	code := exitCodeOf(err)
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(stderr, "deployd: %s\n", msg)
	}
	return code
}

func exitCodeOf(err error) int {
	var ee *exitError
	var ue *api.UnreachableError
	var se *api.StatusError
	var te *api.TransportError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		return ExitUnreachable
	case errors.As(err, &te):
		if te.Midway {
			return ExitFailed
		}
		return ExitUnreachable
	case errors.As(err, &se):
		if se.Kind == "" { // an agent that did not say: its HTTP status does
			return api.KindOfStatus(se.Code).ExitCode()
		}
		return se.Kind.ExitCode()
	}
	return ExitUsage // urfave/cli's own errors are usage errors (bad flag, ...)
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:    "deployd",
		Usage:   "zero-downtime deploy agent: per-core workers behind inherited sockets",
		Version: version.Long(), // --version, -v: urfave/cli prints "deployd version ..."
		Description: "deployd keeps a pool of worker processes per app behind listening sockets it opens\n" +
			"and hands to every worker (systemd's LISTEN_FDS protocol), so the kernel balances\n" +
			"connections and the agent is never on the data path. Reloads start new workers,\n" +
			"wait until they are ready, then drain old ones one by one.\n\n" +
			"Start with `deployd demo`, then try `deployd status` and `deployd reload` in\n" +
			"another terminal. Coming from PM2: `deployd start app.js -i 2 --port 3000` adds the\n" +
			"app to ./deployd.toml and starts it; ls, show, logs, monit, scale, delete follow.\n" +
			"Exit codes: 0 ok, 1 operation failed, 2 usage or config error, 3 agent unreachable.",
		Writer:                 stdout,
		ErrWriter:              stderr,
		UseShortOptionHandling: true,
		ExitErrHandler:         func(*cli.Context, error) {},
		OnUsageError:           usageError,
		Commands: []*cli.Command{
			agentCommand(), demoCommand(), statusCommand(), listCommand(), showCommand(), monitCommand(), dashboardCommand(), reloadCommand(), restartCommand(), logsCommand(),
			scaleCommand(), stopCommand(), startCommand(), pauseCommand(), resumeCommand(), deleteCommand(), deployCommand(), promoteCommand(), abortCommand(), rollbackCommand(), releasesCommand(), upgradeCommand(), shutdownCommand(), versionCommand(), configCommand(), startupCommand(), importCommand(), demoWorkerCommand(),
		},
	}
	app.Commands = append(app.Commands, pm2Commands()...)
	setUsageError(app.Commands)
	return app
}

// setUsageError makes every command report a bad flag on stderr with exit 2
// (by default urfave/cli prints the whole help to stdout).
func setUsageError(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = usageError
		setUsageError(c.Subcommands)
	}
}

var configFlag = &cli.StringFlag{
	Name: "config", Aliases: []string{"c"}, EnvVars: []string{"DEPLOYD_CONFIG"},
	Usage: "config `FILE` (default ./deployd.toml)",
}

var socketFlag = &cli.StringFlag{
	Name: "socket", EnvVars: []string{"DEPLOYD_SOCKET"},
	Usage: "agent control socket `PATH` (default: from the config, else " + config.DefaultSocket() + ")",
}

var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON instead of text"}

// clientFlags are the flags of every command that talks to the agent.
func clientFlags(extra ...cli.Flag) []cli.Flag {
	return append([]cli.Flag{socketFlag, configFlag}, extra...)
}

// usageError reports a bad flag or argument with where to get help.
func usageError(c *cli.Context, err error, _ bool) error {
	if c.Command == nil || c.Command.Name == "" || c.Command.Name == c.App.Name {
		return fail(ExitUsage, "%v (see `deployd --help`; flags go after the command, e.g. deployd status --socket PATH)", err)
	}
	return fail(ExitUsage, "%v (see `deployd %s --help`)", err, c.Command.Name)
}

// socketPath finds the control socket: --socket, $DEPLOYD_SOCKET, the
// config's [agent] socket, else the default. A config that does not load
// as a whole (the CLI's host may lack an app's binary) still names its
// socket.
func socketPath(c *cli.Context) string {
	if s := c.String("socket"); s != "" {
		return s
	}
	path := config.Find(c.String("config"))
	if cfg, err := config.Load(path); err == nil {
		return cfg.Agent.Socket
	}
	var doc struct {
		Agent struct {
			Socket string `toml:"socket"`
		} `toml:"agent"`
	}
	if _, err := toml.DecodeFile(path, &doc); err == nil && doc.Agent.Socket != "" {
		s := doc.Agent.Socket
		if !filepath.IsAbs(s) {
			if abs, err := filepath.Abs(path); err == nil {
				s = filepath.Join(filepath.Dir(abs), s)
			}
		}
		return s
	}
	return config.DefaultSocket()
}

func client(c *cli.Context) *api.Client {
	return api.NewClient(socketPath(c))
}

func ctx(c *cli.Context) context.Context {
	if c.Context != nil {
		return c.Context
	}
	return context.Background()
}

// exactArgs checks the number of positional arguments.
func exactArgs(c *cli.Context, n int, usage string) error {
	if c.NArg() != n {
		return fail(ExitUsage, "usage: deployd %s %s", c.Command.Name, usage)
	}
	return nil
}

// helpAsFlag turns `deployd help CMD [SUB...]` into `deployd CMD [SUB...]
// --help`. urfave/cli v2.27.7's help command renders a command that has
// subcommands only down to USAGE (its template fails on a command that was
// never set up), and `help CMD SUB` shows CMD's help instead of SUB's; the
// --help flag renders both whole.
func helpAsFlag(app *cli.App, args []string) []string {
	if len(args) < 3 || (args[1] != "help" && args[1] != "h") {
		return args
	}
	cmd := app.Command(args[2])
	if cmd == nil {
		return args
	}
	end := 3
	for end < len(args) && cmd.Command(args[end]) != nil {
		cmd, end = cmd.Command(args[end]), end+1
	}
	out := append([]string{args[0]}, args[2:end]...)
	return append(out, "--help")
}

// interspersed moves flags that follow positional arguments in front of
// them, so `deployd reload web --json` works as users expect (urfave/cli v2
// stops parsing flags at the first argument). "--" ends the flags.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	cmd := app.Command(args[1])
	if cmd == nil {
		return args
	}
	start := 2
	for len(cmd.Subcommands) > 0 && start < len(args) {
		sub := cmd.Command(args[start])
		if sub == nil {
			break
		}
		cmd, start = sub, start+1
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, pos []string
	rest := args[start:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" || isNumber(a[1:]) { // "-1": deployd scale web -1
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if !strings.Contains(name, "=") && takesValue[name] && i+1 < len(rest) {
			flags = append(flags, rest[i+1])
			i++
		}
	}
	out := append([]string{}, args[:start]...)
	return append(append(out, flags...), pos...)
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
