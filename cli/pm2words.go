package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

// PM2's words where they mean what deployd does: `all` for every app, a
// script's name (app.js, ./src/server.ts) for the app that runs it, and the
// commands save, resurrect, flush and kill.

// allApps is the app argument PM2 users type for every app.
const allApps = "all"

// agentConfig is the config of the agent on the socket (the file it says it
// runs), or, when no agent answers, the file -c, $DEPLOYD_CONFIG or
// ./deployd.toml names. cfg is nil when that file does not load. One
// command reads it once (one status call, one load), however many app
// arguments it maps: it is kept in the App's Metadata, which lives as long
// as one run of the CLI (Main).
func agentConfig(c *cli.Context) (cfg *config.Config, path string) {
	if m, ok := c.App.Metadata[agentConfigKey].(agentConfigRead); ok {
		return m.cfg, m.path
	}
	path = config.Find(c.String("config"))
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	st, err := client(c).Status(cx, "")
	cancel()
	if err == nil && st.Agent.Config != "" {
		path = st.Agent.Config
	}
	if cfg, err = config.Load(path); err != nil {
		cfg = nil
	}
	if c.App.Metadata != nil {
		c.App.Metadata[agentConfigKey] = agentConfigRead{cfg, path}
	}
	return cfg, path
}

// agentConfigKey keeps agentConfig's reading in the App's Metadata.
const agentConfigKey = "agent config"

// agentConfigRead is one reading of agentConfig.
type agentConfigRead struct {
	cfg  *config.Config
	path string
}

// appArg maps an app argument as PM2 users type it onto an app's name: an
// app's name stays as it is; a script (app.js, ./src/server.ts) becomes the
// app whose command runs it, or, failing that, the app named after the
// script without its extension (what `deployd start FILE` names it).
// Anything else is left for the agent to refuse with its list of apps.
func appArg(c *cli.Context, arg string) (string, error) {
	if arg == "" || arg == allApps {
		return arg, nil
	}
	cfg, path := agentConfig(c)
	if cfg == nil || cfg.Apps[arg] != nil {
		return arg, nil
	}
	matches := appsRunning(cfg, arg)
	switch len(matches) {
	case 0:
		base := filepath.Base(arg)
		if stem := strings.TrimSuffix(base, filepath.Ext(base)); stem != arg && cfg.Apps[stem] != nil {
			return stem, nil
		}
		return arg, nil
	case 1:
		return matches[0], nil
	}
	return "", fail(ExitUsage, "%s is the script of several apps in %s: %s; name one of them", arg, path, strings.Join(matches, ", "))
}

// appsRunning are the names of cfg's apps whose command runs script: an
// argument with the same base name, or, when script names a folder too,
// the same file.
func appsRunning(cfg *config.Config, script string) []string {
	return appsRunningFile(cfg, script, strings.Contains(script, "/"))
}

// appsRunningFile is appsRunning that, with sameFile, takes only the
// same file (script as a path from the working folder) whatever it names.
func appsRunningFile(cfg *config.Config, script string, sameFile bool) []string {
	want := ""
	if sameFile {
		abs, err := filepath.Abs(script)
		if err != nil {
			return nil
		}
		want = abs
	}
	var out []string
	for _, name := range cfg.AppNames {
		app := cfg.Apps[name]
		for _, a := range app.Command {
			p := a
			if !filepath.IsAbs(p) {
				p = filepath.Join(app.Cwd, p)
			}
			if want != "" && filepath.Clean(p) == want || want == "" && filepath.Base(a) == script {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

// appArgs maps every argument with appArg; `all` (alone) stands for every
// app, which the agent takes as an empty list.
func appArgs(c *cli.Context, args []string) ([]string, error) {
	if slices.Contains(args, allApps) && cfgHasNo(c, allApps) {
		if len(args) > 1 {
			return nil, fail(ExitUsage, "all already names every app; drop the other names")
		}
		return nil, nil
	}
	out := make([]string, 0, len(args))
	for _, a := range args {
		name, err := appArg(c, a)
		if err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}

// cfgHasNo reports whether the agent's config has no app called name (an
// app may be called "all").
func cfgHasNo(c *cli.Context, name string) bool {
	cfg, _ := agentConfig(c)
	return cfg == nil || cfg.Apps[name] == nil
}

// oneAppArg is the single app argument of a command that acts on one app:
// a script's name is mapped (appArg); `all` is refused with the way to do
// it for every app.
func oneAppArg(c *cli.Context, usage string) (string, error) {
	if err := exactArgs(c, 1, usage); err != nil {
		return "", err
	}
	arg := c.Args().First()
	if arg == allApps && cfgHasNo(c, allApps) {
		return "", fail(ExitUsage, "deployd %s acts on one app at a time: name it (deployd ls lists them)", c.Command.Name)
	}
	return appArg(c, arg)
}

// eachAppArg runs fn for the app argument of c, or, for `all`, for every
// app of the agent's config in turn, stopping at the first failure.
func eachAppArg(c *cli.Context, usage string, fn func(app string) error) error {
	if err := exactArgs(c, 1, usage); err != nil {
		return err
	}
	arg := c.Args().First()
	if arg != allApps || !cfgHasNo(c, allApps) {
		app, err := appArg(c, arg)
		if err != nil {
			return err
		}
		return fn(app)
	}
	cfg, path := agentConfig(c)
	if cfg == nil || len(cfg.AppNames) == 0 {
		return fail(ExitUsage, "all: %s has no apps to %s", path, c.Command.Name)
	}
	for _, app := range cfg.AppNames {
		if err := fn(app); err != nil {
			return err
		}
	}
	return nil
}

// pm2Commands are PM2's commands that deployd has no need of, each
// explained in a line, and the ones it has under another name.
func pm2Commands() []*cli.Command {
	return []*cli.Command{
		{
			Name:  "save",
			Usage: "(PM2) nothing to save: the agent runs what its config file says",
			Description: "pm2 save writes the process list so that pm2 resurrect can start it again.\n" +
				"deployd keeps no separate list: `deployd start FILE` writes the app into the\n" +
				"config file, and state.json keeps each app's scale count and stopped flag, so\n" +
				"an agent that starts (at boot: deployd startup systemd) runs them again.",
			Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				_, path := agentConfig(c)
				fmt.Fprintf(c.App.ErrWriter, "nothing to save: the apps are in %s and their scale counts and stops in the agent's state.json; "+
					"the agent runs them again when it starts (at boot: deployd startup systemd)\n", path)
				return nil
			},
		},
		{
			Name:  "resurrect",
			Usage: "(PM2) the agent starts every app of its config file when it starts",
			Description: "pm2 resurrect starts the processes pm2 save wrote. A deployd agent starts\n" +
				"every app of its config file when it starts (and adopts the workers a previous\n" +
				"agent left running); this command says whether one runs, and how to start it.",
			Flags: clientFlags(),
			Action: func(c *cli.Context) error {
				cx, cancel := context.WithTimeout(ctx(c), 5*time.Second)
				defer cancel()
				st, err := client(c).Status(cx, "")
				if err != nil {
					path := config.Find(c.String("config"))
					return fail(ExitUnreachable, "no agent answers (%v): start it with `deployd agent -c %s` "+
						"(or at boot: deployd startup systemd); it starts every app of the file", err, path)
				}
				names := make([]string, 0, len(st.Apps))
				for _, a := range st.Apps {
					names = append(names, a.Name+" ("+a.State+")")
				}
				fmt.Fprintf(c.App.ErrWriter, "nothing to resurrect: the agent (pid %d) runs %s: %s\n",
					st.Agent.PID, st.Agent.Config, strings.Join(names, ", "))
				return nil
			},
		},
		{
			Name:      "flush",
			Usage:     "(PM2) empty the log files of an app, or of every app: deployd logs --flush",
			ArgsUsage: "[APP|all]",
			Flags:     clientFlags(jsonFlag),
			Action: func(c *cli.Context) error {
				if c.NArg() > 1 {
					return fail(ExitUsage, "usage: deployd flush [APP]")
				}
				app, err := appArg(c, c.Args().First())
				if err != nil {
					return err
				}
				if app == allApps && cfgHasNo(c, allApps) {
					app = ""
				}
				return logFiles(c, "emptied", func(cx context.Context, cl *api.Client) (*api.LogFilesResult, error) {
					return cl.FlushLogs(cx, app)
				})
			},
		},
	}
}

// checkAgentFile refuses a reload whose -c (or $DEPLOYD_CONFIG) names
// another file than the one the agent on the socket runs: the agent
// re-reads only its own file, and the named one would be ignored. Without
// -c, a ./deployd.toml that is not the agent's file gets a note, as the
// reload goes on with the agent's file. An agent that does not answer is
// left for the operation to report.
func checkAgentFile(c *cli.Context) error {
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	st, err := client(c).Status(cx, "")
	cancel()
	if err != nil || st.Agent.Config == "" {
		return nil
	}
	named := c.String("config")
	if named == "" {
		if _, err := os.Stat(config.DefaultPath); err == nil && !sameFile(st.Agent.Config, config.DefaultPath) {
			fmt.Fprintf(c.App.ErrWriter, "note: the agent on %s runs %s, not ./deployd.toml, which this reload does not read "+
				"(add its apps to the agent's file: deployd start FILE, deployd import pm2 FILE --apply)\n", st.Agent.Socket, st.Agent.Config)
		}
		return nil
	}
	if sameFile(st.Agent.Config, named) {
		return nil
	}
	return fail(ExitUsage, "the agent on %s runs %s, not %s: a reload re-reads the agent's own file. "+
		"Add the apps to it (deployd start FILE, deployd import pm2 FILE --apply), or run another agent for %s: deployd agent -c %s --socket PATH",
		st.Agent.Socket, st.Agent.Config, named, named, named)
}
