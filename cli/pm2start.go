package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers/nodejs"
)

// `deployd start FILE -i N` and `deployd delete NAME`, as PM2 users type
// them: they add an app to the config file (or remove it) as text, then
// have the agent reload that app, which starts (or stops) it.

const startHelp = "Two forms:\n" +
	"  deployd start APP      start an app stopped by `deployd stop` (also FILE, when the\n" +
	"                         app that FILE would add is there, runs FILE and is stopped).\n" +
	"  deployd start FILE [-i N|max] [--name NAME] [--port PORT] [--env ENV] [-- ARGS...]\n" +
	"                         as `pm2 start`: add an [apps.NAME] table for FILE to the config\n" +
	"                         file, then start it. The rest of the file (comments, layout) is\n" +
	"                         kept as written; the new table is added at its end.\n\n" +
	"The PM2 form is taken when the argument is not an app of the config and is a file, or\n" +
	"when -i, --name, --port, --interpreter(-args) or --env-file is given. .js, .cjs and .mjs files run with node\n" +
	"(its preload maps the app's listen(PORT) onto the agent's socket and drains on reloads;\n" +
	"without --port, the agent binds the port the app's first listen(PORT) asks for);\n" +
	"a .ts file with the project's tsx (node --import tsx) or ts-node, or node itself where it\n" +
	"strips types (22.18+); any other file must be executable, or name its interpreter with\n" +
	"--interpreter (a path is relative to where you type it); --interpreter-args (or --node-args)\n" +
	"go between the interpreter and FILE. --env-file FILE sets env_file:\n" +
	"its NAME=value lines (a .env file) reach the workers.\n" +
	"NAME defaults to FILE without its extension; -i defaults to 1 as in PM2, and -i max\n" +
	"(or 0) is one worker per CPU, -i -1 all CPUs but one. --port PORT (or PORT in the\n" +
	"environment) is the port the app listens on: the agent opens it, hands it to every\n" +
	"worker, and sets PORT for the app. --env ENV selects the app's [apps.NAME.env_ENV]\n" +
	"variables (environment = \"ENV\"); for node it starts with NODE_ENV = \"ENV\".\n\n" +
	"Examples: deployd start app.js -i 2\n" +
	"          deployd start app.js -i 2 --port 3000\n" +
	"          deployd start server.js -i max --name api --port 8080 --env production\n" +
	"          deployd start ./bin/worker --port 9000 -- --verbose\n" +
	"          deployd start src/server.ts -i 2 --env-file .env\n" +
	"          deployd start web      # after deployd stop web"

func startCommand() *cli.Command {
	return &cli.Command{
		Name:        "start",
		Usage:       "start a stopped app, or add a script to the config and start it (as pm2 start)",
		ArgsUsage:   "APP | FILE [-- ARGS...]",
		Description: startHelp,
		Flags: clientFlags(jsonFlag,
			&cli.StringFlag{Name: "instances", Aliases: []string{"i"}, Usage: "workers: `N`, max (or 0: one per CPU), -N (all CPUs but N)"},
			&cli.StringFlag{Name: "name", Usage: "the app's `NAME` in the config (default: FILE without its extension)"},
			&cli.IntFlag{Name: "port", Usage: "the `PORT` the app listens on (default: $PORT)"},
			&cli.StringFlag{Name: "env", Usage: "select the app's env_`ENV` variables (environment = \"ENV\")"},
			&cli.StringFlag{Name: "interpreter", Usage: "run FILE with `PROG` (default: node for .js, .cjs, .mjs; the project's tsx or ts-node for .ts; else FILE itself)"},
			&cli.StringFlag{Name: "interpreter-args", Aliases: []string{"node-args"}, Usage: "`ARGS` for the interpreter, before FILE (e.g. \"run --allow-net --allow-env\" for deno)"},
			&cli.StringFlag{Name: "env-file", Usage: "the app's variables from `FILE` (NAME=value lines, as .env; env_file in the config)"},
			&cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 {
				return fail(ExitUsage, "usage: deployd start APP, or deployd start FILE [-i N] [--name NAME] [--port PORT] (see `deployd start --help`)")
			}
			if !pm2Form(c) {
				return startStopped(c)
			}
			if app := stoppedAppOfScript(c); app != "" {
				return startApp(c, app)
			}
			return startFile(c)
		},
	}
}

// pm2Form reports whether `deployd start ARG` is the PM2 form: a flag
// only that form has, or an argument that is a file and no app's name.
func pm2Form(c *cli.Context) bool {
	for _, f := range []string{"instances", "name", "port", "interpreter", "interpreter-args", "env-file"} {
		if c.IsSet(f) {
			return true
		}
	}
	arg := c.Args().First()
	if cfg, _ := agentConfig(c); cfg != nil && cfg.Apps[arg] != nil {
		return false
	}
	fi, err := os.Stat(arg)
	return err == nil && fi.Mode().IsRegular() || strings.Contains(arg, "/") || c.NArg() > 1
}

func startStopped(c *cli.Context) error {
	if err := exactArgs(c, 1, "APP"); err != nil {
		return err
	}
	return startApp(c, c.Args().First())
}

// stoppedAppOfScript is the app `deployd start FILE` starts again, as pm2
// start does for a stopped process of its script: the app start would add
// (named by --name, else after FILE) is in the agent's file, its command
// runs that same file, and the agent has it stopped. "" otherwise, and
// with a flag that would change the app: the PM2 form goes on (and
// refuses a name the file has).
func stoppedAppOfScript(c *cli.Context) string {
	if c.NArg() != 1 {
		return ""
	}
	for _, f := range []string{"instances", "port", "interpreter", "interpreter-args", "env-file", "env"} {
		if c.IsSet(f) {
			return ""
		}
	}
	file := c.Args().First()
	name := c.String("name")
	if name == "" {
		base := filepath.Base(file)
		name = strings.TrimSuffix(base, filepath.Ext(base))
	}
	cfg, _ := agentConfig(c)
	if cfg == nil || cfg.Apps[name] == nil || !slices.Contains(appsRunningFile(cfg, file, true), name) {
		return ""
	}
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	defer cancel()
	st, err := client(c).Status(cx, name)
	if err != nil || len(st.Apps) != 1 || st.Apps[0].State != "stopped" {
		return ""
	}
	return name
}

// startApp starts app, an app of the config that `deployd stop` stopped.
func startApp(c *cli.Context, app string) error {
	if c.IsSet("env") {
		return fail(ExitUsage, "--env with an app of the config: run `deployd reload %s --env %s` (it records the choice in the config and reloads)", app, c.String("env"))
	}
	return runStream(c, "start", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
		return cl.StartApp(cx, app, on)
	})
}

var envNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// startSpec is what `deployd start FILE` writes.
type startSpec struct {
	name, file, cwd string
	argv            []string
	instances       string
	port            int
	env             string
	envFile         string // absolute
	node            bool
	// readyTimeout is the ready_timeout to write ("" leaves the default),
	// with why.
	readyTimeout, readyWhy string
	// line is the command the user typed, kept as a comment.
	line string
}

func startFile(c *cli.Context) error {
	path, err := configToEdit(c)
	if err != nil {
		return err
	}
	n, err := startSpecOf(c, path)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(ExitUsage, "read %s: %v", path, err)
	}
	edited, err := config.AppendApp(data, n.name, n.block())
	switch {
	case errors.Is(err, config.ErrAppExists):
		return fail(ExitUsage, "app %q is already in %s: pick another --name, apply a change to it with `deployd reload %s`, or remove it first with `deployd delete %s`",
			n.name, path, n.name, n.name)
	case err != nil:
		return fail(ExitUsage, "%s: %v", path, err)
	}
	if _, err := config.WriteEdited(path, edited); err != nil {
		return fail(ExitUsage, "%v\nnothing was written to %s", err, path)
	}
	fmt.Fprintf(c.App.ErrWriter, "added [apps.%s] to %s\n", n.name, path)
	applied, err := applyEdit(c, "start", n.name, path,
		fmt.Sprintf("%s stays in %s: fix it and run `deployd reload %s`, or `deployd delete %s`", n.name, path, n.name, n.name))
	if applied && !c.Bool("json") {
		fmt.Fprintf(c.App.ErrWriter, "%s serves %s; see it with `deployd ls`, `deployd logs %s -f`, `deployd show %s`\n", n.name, servedAt(c, n), n.name, n.name)
	}
	return err
}

// servedAt names where the app n started serves: its --port, else the
// address the agent learnt from the app's own listen, as the agent says.
func servedAt(c *cli.Context, n *startSpec) string {
	if n.port > 0 {
		return fmt.Sprintf("port %d", n.port)
	}
	cx, cancel := context.WithTimeout(ctx(c), 5*time.Second)
	defer cancel()
	if st, err := client(c).Status(cx, n.name); err == nil && len(st.Apps) == 1 && len(st.Apps[0].Listen) > 0 {
		return strings.Join(st.Apps[0].Listen, " ")
	}
	return "the address its listen() asks for (deployd show " + n.name + " names it)"
}

// configToEdit is the config file that start, delete and reload --env
// edit: -c, $DEPLOYD_CONFIG or ./deployd.toml; when none of them is given
// and ./deployd.toml does not exist, the file the agent on the socket runs.
// An agent that runs another file than the one named is refused: the
// edit would not reach it.
func configToEdit(c *cli.Context) (string, error) {
	path := config.Find(c.String("config"))
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	st, err := client(c).Status(cx, "")
	cancel()
	if err != nil {
		return path, nil // no agent: the edit waits in the file for one
	}
	_, statErr := os.Stat(path)
	switch {
	case sameFile(st.Agent.Config, path):
		return path, nil
	case c.String("config") == "" && errors.Is(statErr, fs.ErrNotExist):
		return st.Agent.Config, nil
	}
	return "", fail(ExitUsage, "the agent on %s runs %s, not %s: pass -c %s to change its apps",
		st.Agent.Socket, st.Agent.Config, path, st.Agent.Config)
}

// applyEdit reloads app after its config changed, so that the agent adds,
// changes or removes it, and reports whether an agent did. An agent that
// does not run is no error: the edit is in the file, and the agent applies
// it when it starts.
func applyEdit(c *cli.Context, verb, app, path, onFailure string) (bool, error) {
	err := runStream(c, verb, func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
		return cl.Reload(cx, api.ReloadRequest{Apps: []string{app}}, on)
	})
	if exitCodeOf(err) == ExitUnreachable {
		fmt.Fprintf(c.App.ErrWriter, "the agent does not answer (%v); it applies %s when it starts: deployd agent -c %s\n", err, path, path)
		return false, nil
	}
	if err != nil && onFailure != "" {
		fmt.Fprintln(c.App.ErrWriter, onFailure)
	}
	return err == nil, err
}

// startSpecOf reads the PM2 form's arguments and flags.
func startSpecOf(c *cli.Context, configPath string) (*startSpec, error) {
	args := c.Args().Slice()
	file, rest := args[0], args[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	fi, err := os.Stat(file)
	switch {
	case err != nil:
		return nil, fail(ExitUsage, "%s: no such file or app (`deployd start APP` starts a stopped app, `deployd start FILE` adds FILE as an app)", file)
	case !fi.Mode().IsRegular():
		return nil, fail(ExitUsage, "%s: not a file; give the script or program to run", file)
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, fail(ExitFailed, "%v", err)
	}
	n := &startSpec{file: file, cwd: wd, env: c.String("env"), line: "deployd start " + strings.Join(args, " ")}
	if typed, ok := c.App.Metadata["args"].([]string); ok && len(typed) > 1 {
		n.line = "deployd " + strings.Join(typed[1:], " ")
	}
	n.line = strings.Map(func(r rune) rune { // it becomes a comment line
		if r < ' ' {
			return ' '
		}
		return r
	}, n.line)
	n.name = c.String("name")
	if n.name == "" {
		base := filepath.Base(file)
		n.name = strings.TrimSuffix(base, filepath.Ext(base))
	}
	if n.env != "" && !envNameRE.MatchString(n.env) {
		return nil, fail(ExitUsage, "--env %q: use letters, digits, '_' or '-', e.g. --env production", n.env)
	}
	if n.instances, err = pm2InstancesFlag(c); err != nil {
		return nil, err
	}
	// A program's path in command resolves against the config file's
	// folder: relative ("./server") when that is this folder, else absolute.
	script, err := filepath.Abs(file)
	if err != nil {
		return nil, fail(ExitFailed, "%v", err)
	}
	if cfgAbs, err := filepath.Abs(configPath); err == nil && filepath.Dir(cfgAbs) == wd {
		if rel, err := filepath.Rel(wd, script); err == nil && !strings.HasPrefix(rel, "..") {
			script = "./" + rel
		}
	}
	if ef := c.String("env-file"); ef != "" {
		if n.envFile, err = envFileFlag(ef); err != nil {
			return nil, err
		}
	}
	switch interp := c.String("interpreter"); {
	case interp != "":
		// A path is where the user typed it from, not the config's folder.
		if strings.Contains(interp, "/") && !filepath.IsAbs(interp) {
			interp = filepath.Join(wd, interp)
		}
		n.argv = []string{interp, file}
		n.node = nodejs.Detect(n.argv)
		n.readyTimeout, n.readyWhy = runnerStartup(n.argv)
	case isTypeScript(file):
		runner, err := typeScriptRunner(file, wd)
		if err != nil {
			return nil, err
		}
		n.argv, n.node = append(runner, file), true
		n.readyTimeout, n.readyWhy = runnerStartup(runner)
	case isNodeScript(file):
		n.argv, n.node = []string{"node", file}, true
	case fi.Mode()&0o111 == 0:
		return nil, fail(ExitUsage, "%s is not executable and not a .js, .cjs or .mjs file: give its interpreter (--interpreter python3) or chmod +x %s", file, file)
	default:
		n.argv = []string{script}
	}
	if ia := strings.Fields(c.String("interpreter-args")); len(ia) > 0 {
		// As PM2's: between the interpreter (and its loader) and FILE.
		if len(n.argv) == 1 {
			return nil, fail(ExitUsage, "--interpreter-args: %s runs as a program of its own, with no interpreter to take them; "+
				"give one with --interpreter, or pass the program's own arguments after --", file)
		}
		n.argv = slices.Insert(n.argv, len(n.argv)-1, ia...)
	}
	n.argv = append(n.argv, rest...)
	if n.port = c.Int("port"); !c.IsSet("port") {
		if p := os.Getenv("PORT"); p != "" {
			if n.port, err = strconv.Atoi(p); err != nil {
				return nil, fail(ExitUsage, "PORT=%q in the environment is not a port number; pass --port N", p)
			}
		}
	}
	switch {
	case n.port == 0 && n.node:
		// No listen list: the agent binds what the app's listen(port) asks for.
	case n.port == 0:
		return nil, fail(ExitUsage, "which port does %s listen on? add --port N (or set PORT): the agent opens that port and hands it to every worker, "+
			"which is how reloads lose no connection; an app that serves no port needs a config table written by hand", file)
	case n.port < 1 || n.port > 65535:
		return nil, fail(ExitUsage, "--port %d: want 1 to 65535", n.port)
	}
	return n, nil
}

func isNodeScript(file string) bool {
	switch filepath.Ext(file) {
	case ".js", ".cjs", ".mjs":
		return true
	}
	return false
}

// pm2InstancesFlag maps -i as PM2 reads it: max and 0 are one worker per
// CPU, -N all CPUs but N, N that many; without -i one worker, PM2's default.
func pm2InstancesFlag(c *cli.Context) (string, error) {
	if !c.IsSet("instances") {
		return "1", nil
	}
	s := strings.TrimSpace(c.String("instances"))
	if s == "max" || s == "0" {
		return `"max"`, nil
	}
	v, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return "", fail(ExitUsage, "-i %q: use a number of workers, max (one per CPU) or -N (all CPUs but N)", s)
	case v < 0:
		return strconv.Quote(s), nil
	}
	return strconv.Itoa(v), nil
}

// block is the [apps.NAME] table text for n.
func (n *startSpec) block() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# added by `%s`\n", n.line)
	fmt.Fprintf(&b, "[apps.%s]\n", tomlKey(n.name))
	fmt.Fprintf(&b, "command   = %s\n", tomlList(n.argv))
	fmt.Fprintf(&b, "cwd       = %s\n", tomlString(n.cwd))
	fmt.Fprintf(&b, "instances = %s\n", n.instances)
	if n.envFile != "" {
		fmt.Fprintf(&b, "env_file  = %s\n", tomlString(n.envFile))
	}
	if n.readyTimeout != "" {
		fmt.Fprintf(&b, "ready_timeout = %s   # %s\n", tomlString(n.readyTimeout), n.readyWhy)
	}
	if n.port > 0 {
		fmt.Fprintf(&b, "listen    = [\"tcp://0.0.0.0:%d\"]\n", n.port)
		fmt.Fprintf(&b, "env       = { PORT = \"%d\" }\n", n.port)
	} else {
		b.WriteString("# no listen: deployd binds the port the app's listen(port) asks for\n")
	}
	if n.env != "" {
		fmt.Fprintf(&b, "environment = %s\n", tomlString(n.env))
		fmt.Fprintf(&b, "\n[apps.%s.env_%s]\n", tomlKey(n.name), n.env)
		if n.node {
			fmt.Fprintf(&b, "NODE_ENV = %s\n", tomlString(n.env))
		} else {
			fmt.Fprintf(&b, "# the variables of --env %s, e.g. MODE = \"%s\"\n", n.env, n.env)
		}
	}
	return b.String()
}

// tomlKey writes an app name as a TOML key (bare when it can be).
func tomlKey(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return tomlString(s)
		}
	}
	return s
}

// envFileFlag checks start's --env-file and returns it absolute: a regular
// file (the agent checks its owner and mode when it reads it).
func envFileFlag(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fail(ExitFailed, "%v", err)
	}
	fi, err := os.Lstat(abs)
	switch {
	case err != nil:
		return "", fail(ExitUsage, "--env-file %s: %v", path, errors.Unwrap(err))
	case fi.Mode()&fs.ModeSymlink != 0:
		return "", fail(ExitUsage, "--env-file %s is a symbolic link; name the file itself", path)
	case !fi.Mode().IsRegular():
		return "", fail(ExitUsage, "--env-file %s is not a regular file", path)
	}
	return abs, nil
}
