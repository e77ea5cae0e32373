package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

// `deployd list`, `show` and `monit`: the views PM2 users look for.

func listCommand() *cli.Command {
	return &cli.Command{
		Name:      "list",
		Aliases:   []string{"ls"},
		Usage:     "list apps and their workers (as pm2 list; the table of `deployd status`)",
		ArgsUsage: "[APP]",
		Description: "One line per worker: app, slot, pid, state, release, generation, uptime, restarts,\n" +
			"CPU and memory. `deployd status` shows the same and more; --json prints it as JSON.\n\n" +
			"Examples: deployd ls\n" +
			"          deployd list web --json",
		Flags: clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fail(ExitUsage, "usage: deployd list [APP]")
			}
			st, err := client(c).Status(ctx(c), c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return encodeIndent(c.App.Writer, st)
			}
			printStatus(c.App.Writer, st)
			return nil
		},
	}
}

func monitCommand() *cli.Command {
	return &cli.Command{
		Name:      "monit",
		Usage:     "watch every worker's state, CPU and memory, refreshed (as pm2 monit)",
		ArgsUsage: "[APP]",
		Description: "`deployd status --watch 1s`: the status table, redrawn every --interval until\n" +
			"Ctrl-C, with each worker's CPU and resident memory. `deployd logs -f` follows the\n" +
			"output in another terminal.\n\n" +
			"Examples: deployd monit\n" +
			"          deployd monit web --interval 5s",
		Flags: clientFlags(&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh every `D`"}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fail(ExitUsage, "usage: deployd monit [APP]")
			}
			every := c.Duration("interval")
			if every <= 0 {
				return fail(ExitUsage, "--interval %s: want more than 0, e.g. 1s", every)
			}
			cx, stop := signal.NotifyContext(ctx(c), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cl := client(c)
			for first := true; ; first = false {
				st, err := cl.Status(cx, c.Args().First())
				if cx.Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				watchHeader(c.App.Writer, every, first)
				printStatus(c.App.Writer, st)
				select {
				case <-cx.Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
}

func showCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Aliases:   []string{"describe", "info"},
		Usage:     "one app's details: its config, workers, release and log files (as pm2 show)",
		ArgsUsage: "APP",
		Description: "Prints the app's settings as the config file resolves them (command, cwd, instances\n" +
			"and a count `deployd scale` set over them, listen, readiness, environment and the\n" +
			"names of its variables), then its state, release and workers as the agent reports\n" +
			"them, and the paths of its log files. Values of variables are not printed.\n\n" +
			"Example: deployd show web",
		Flags: clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			name, err := oneAppArg(c, "APP")
			if err != nil {
				return err
			}
			cfg, path := agentConfig(c) // the agent's file, not ./deployd.toml
			var app *config.App
			if cfg != nil {
				app = cfg.Apps[name]
			}
			st, err := client(c).Status(ctx(c), name)
			if err != nil && app == nil {
				return err
			}
			var status *api.App
			if err == nil && len(st.Apps) == 1 {
				status = &st.Apps[0]
			}
			if c.Bool("json") {
				return encodeIndent(c.App.Writer, showJSON(cfg, app, status))
			}
			printShow(c.App.Writer, path, cfg, app, status, err)
			return nil
		},
	}
}

func encodeIndent(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// logPaths are app's log files in cfg's log_dir.
func logPaths(cfg *config.Config, app string) (out, errLog string) {
	return filepath.Join(cfg.Agent.LogDir, app+".out.log"), filepath.Join(cfg.Agent.LogDir, app+".err.log")
}

// envNames are the names of the variables of a, without values.
func envNames(a *config.App) []string {
	names := make([]string, len(a.Env))
	for i, kv := range a.Env {
		names[i], _, _ = strings.Cut(kv, "=")
	}
	return names
}

func showJSON(cfg *config.Config, a *config.App, st *api.App) map[string]any {
	out := map[string]any{"status": st}
	if a != nil {
		var ls []string
		for _, l := range a.Listen {
			ls = append(ls, l.URL)
		}
		o, e := logPaths(cfg, a.Name)
		out["config"] = map[string]any{
			"file": cfg.Path, "command": a.Command, "cwd": a.Cwd, "instances": a.Instances, "listen": ls,
			"ready": a.Ready.Raw, "ready_timeout": a.ReadyTimeout.String(), "stop_signal": unix.SignalName(a.StopSignal),
			"stop_timeout": a.StopTimeout.String(), "environment": a.Environment, "environments": a.Environments,
			"env_names": envNames(a), "releases": a.Releases,
		}
		out["logs"] = map[string]string{"out": o, "err": e}
	}
	return out
}

func printShow(w io.Writer, path string, cfg *config.Config, a *config.App, st *api.App, statusErr error) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{k}, args...)...)
	}
	if a == nil {
		fmt.Fprintf(w, "%s: not in the config file %s\n", st.Name, path)
	} else {
		fmt.Fprintf(tw, "%s (config %s)\n", a.Name, cfg.Path)
		row("command", "%s", strings.Join(a.Command, " "))
		row("cwd", "%s", a.Cwd)
		inst := fmt.Sprintf("%d", a.Instances)
		if a.InstancesSpec != inst {
			inst += fmt.Sprintf(" (instances = %s)", a.InstancesSpec)
		}
		if st != nil && st.Scaled > 0 && st.Scaled != a.Instances {
			inst += "; " + api.ScaledMessage(a.Name, st.Scaled, a.Instances)
		}
		row("instances", "%s", inst)
		var ls []string
		for _, l := range a.Listen {
			ls = append(ls, l.URL)
		}
		switch {
		case len(ls) > 0:
			row("listen", "%s", strings.Join(ls, " "))
		case st != nil && len(st.Listen) > 0:
			row("listen", "%s", strings.Join(st.Listen, " "))
		default:
			row("listen", "none")
		}
		row("ready", "%s within %s; stop %s, then SIGKILL after %s", a.Ready.Raw, a.ReadyTimeout, unix.SignalName(a.StopSignal), a.StopTimeout)
		env := orNone(a.Environment)
		if len(a.Environments) > 0 {
			env += " (tables: env_" + strings.Join(a.Environments, ", env_") + ")"
		}
		row("environment", "%s", env)
		row("variables", "%s", orNone(strings.Join(envNames(a), " ")))
		row("node", "%s", nodeMode(a))
		o, e := logPaths(cfg, a.Name)
		row("stdout log", "%s", o)
		row("stderr log", "%s", e)
	}
	tw.Flush()
	fmt.Fprintln(w)
	if st == nil {
		fmt.Fprintf(w, "agent: %v\n", statusErr)
		return
	}
	release := st.Release
	if release == "" {
		release = "-"
	}
	fmt.Fprintf(w, "state %s, release %s, %d workers, %d restarts\n", st.State, release, len(st.Workers), st.Restarts)
	if len(st.Workers) > 0 {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SLOT\tPID\tSTATE\tRELEASE\tUPTIME\tRESTARTS\tCPU\tRSS")
		for _, wk := range st.Workers {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%.1f%%\t%s\n", wk.Slot, wk.PID, wk.State, wk.Release,
				fmtDuration(wk.UptimeSeconds), wk.Restarts, wk.CPUPercent, fmtBytes(wk.RSSBytes))
		}
		tw.Flush()
	}
	if st.LastExit != "" {
		fmt.Fprintf(w, "last exit: %s\n", st.LastExit)
		for _, l := range st.LastLines {
			fmt.Fprintf(w, "  | %s\n", l)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
