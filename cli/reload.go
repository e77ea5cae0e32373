package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/demoapp"
	"github.com/deployd/deployd/internal/version"
)

func reloadCommand() *cli.Command {
	return &cli.Command{
		Name:      "reload",
		Usage:     "re-read the config and replace workers with zero downtime",
		ArgsUsage: "[APP...]",
		Description: "Re-reads the config file and moves each named app (all apps if none) to it.\n" +
			"rolling (default): for max_surge slots at a time, start a new worker, wait until\n" +
			"it is ready (the first batch also stays up min_ready), then drain the old one.\n" +
			"blue-green: start every new worker, wait until all are, then drain every old one;\n" +
			"with balance even or sticky, all new workers take their places at one moment\n" +
			"(one kernel map update, the cutover event) before any old one stops.\n" +
			"A new worker that is not ready within ready_timeout, or exits (any status) before\n" +
			"the reload ended, abandons the reload: the new workers stop and the old version\n" +
			"keeps serving. An invalid config changes nothing.\n\n" + canaryHelp + "\n" +
			"Progress goes to stderr; --json prints one JSON event per line and a final result.\n" +
			"Exit codes: 0 done (or canary held), 1 abandoned or failed (old version still serving),\n" +
			"or refused (another operation or a held canary), 2 usage or config error, 3 agent unreachable.\n\n" +
			"--env ENV first records environment = \"ENV\" in each app's table (every app that has\n" +
			"an [apps.NAME.env_ENV] table, when no app is named), so that the workers start with\n" +
			"those variables over env, as pm2 reload --env ENV does; the rest of the file is kept.\n\n" +
			"Examples: deployd reload web --strategy blue-green\n" +
			"          deployd reload web --env production\n" +
			"          deployd reload web --canary 1 && deployd status web && deployd promote web",
		Flags: clientFlags(jsonFlag,
			&cli.StringFlag{Name: "strategy", Value: "rolling", Usage: "rolling or blue-green"},
			canaryFlag,
			&cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D` (the reload goes on in the agent); default: no limit"},
			&cli.StringFlag{Name: "env", Usage: "select the env_`ENV` variables of the apps (recorded in the config)"},
		),
		Action: func(c *cli.Context) error {
			if err := checkAgentFile(c); err != nil {
				return err
			}
			if c.IsSet("env") {
				if err := selectEnv(c, c.String("env"), c.Args().Slice()); err != nil {
					return err
				}
			}
			s := c.String("strategy")
			if s != "rolling" && s != "blue-green" {
				return fail(ExitUsage, "--strategy %q: use rolling or blue-green", s)
			}
			n, err := canaryOf(c)
			if err != nil {
				return err
			}
			apps, err := appArgs(c, c.Args().Slice())
			if err != nil {
				return err
			}
			req := api.ReloadRequest{Apps: apps, Strategy: s, Canary: n}
			return runStream(c, "reload", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
				return cl.Reload(cx, req, on)
			})
		},
	}
}

func restartCommand() *cli.Command {
	return &cli.Command{
		Name:      "restart",
		Usage:     "stop every worker of an app, then start them again (also clears errored)",
		ArgsUsage: "APP",
		Description: "For apps that cannot run two versions side by side, and to start an app that\n" +
			"is errored (crashed too often) again. This drops capacity to zero while it runs;\n" +
			"use `deployd reload` for a zero-downtime replacement.",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"}),
		Action: func(c *cli.Context) error {
			return eachAppArg(c, "APP|all", func(app string) error {
				return runStream(c, "restart", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
					return cl.Restart(cx, app, on)
				})
			})
		},
	}
}

// opCall is one streamed call to the agent: it reports progress to on and
// returns the operation's result (R: *api.Result, *api.DeployResult).
type opCall[R any] func(context.Context, *api.Client, func(api.Event)) (R, error)

// callOp runs a streamed operation within --timeout, printing its progress
// (eventPrinter); it returns the result, and the encoder its --json output
// goes on, or the error a user reads (opError).
func callOp[R any](c *cli.Context, verb string, call opCall[R]) (R, *json.Encoder, error) {
	cx, cancel := opContext(c)
	defer cancel()
	enc := json.NewEncoder(c.App.Writer)
	res, err := call(cx, client(c), eventPrinter(c, enc))
	return res, enc, opError(c, verb, err)
}

// runStream runs a streamed operation, printing progress and a summary.
func runStream(c *cli.Context, verb string, call opCall[*api.Result]) error {
	res, enc, err := callOp(c, verb, call)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		_ = enc.Encode(res)
	} else {
		printSummary(c.App.ErrWriter, verb, res)
	}
	if !res.OK {
		return fail(ExitFailed, "")
	}
	return nil
}

// opContext bounds an operation's wait by --timeout (no bound when unset).
func opContext(c *cli.Context) (context.Context, context.CancelFunc) {
	if d := c.Duration("timeout"); d > 0 {
		return context.WithTimeout(ctx(c), d)
	}
	return context.WithCancel(ctx(c))
}

// eventPrinter prints progress: JSON lines on stdout with --json, else text
// on stderr.
func eventPrinter(c *cli.Context, enc *json.Encoder) func(api.Event) {
	return func(e api.Event) {
		if c.Bool("json") {
			_ = enc.Encode(e)
			return
		}
		printEvent(c.App.ErrWriter, e)
	}
}

// opError turns a streamed operation's error into the CLI's: a --timeout
// that passed, or a refusal because another operation runs (exit 1).
func opError(c *cli.Context, verb string, err error) error {
	var se *api.StatusError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fail(ExitFailed, "%s: gave up waiting after --timeout %s; the agent goes on with it (see `deployd status`)",
			verb, c.Duration("timeout"))
	case errors.As(err, &se) && se.Kind == api.KindBusy:
		return fail(ExitFailed, "%s", se.Message)
	}
	return err
}

func printEvent(w io.Writer, e api.Event) {
	note := ""
	if e.Message != "" && e.Type != api.EventExited && e.Type != api.EventFailed {
		note = " (" + e.Message + ")"
	}
	switch e.Type {
	case api.EventStarted:
		fmt.Fprintf(w, "%s[%d]: started pid %d, release %s%s\n", e.App, e.Slot, e.PID, e.Release, note)
	case api.EventReady:
		fmt.Fprintf(w, "%s[%d]: pid %d ready after %d ms%s\n", e.App, e.Slot, e.PID, e.Millis, note)
	case api.EventDraining:
		fmt.Fprintf(w, "%s[%d]: old pid %d draining\n", e.App, e.Slot, e.PID)
	case api.EventExited:
		fmt.Fprintf(w, "%s[%d]: pid %d exited after %d ms (%s)\n", e.App, e.Slot, e.PID, e.Millis, e.Message)
	case api.EventFailed:
		fmt.Fprintf(w, "%s[%d]: pid %d failed: %s\n", e.App, e.Slot, e.PID, e.Message)
	default:
		fmt.Fprintf(w, "%s: %s %s\n", e.App, e.Type, e.Message)
	}
}

func printSummary(w io.Writer, verb string, res *api.Result) {
	for _, a := range res.Apps {
		d := time.Duration(a.DurationSeconds * float64(time.Second)).Round(time.Millisecond)
		switch a.Outcome {
		case api.OutcomeHeld:
			printHeld(w, a.App, a.Canary)
		case api.OutcomePromoted, api.OutcomeAborted:
			printCanaryEnd(w, a, d)
		case api.OutcomeDone:
			if a.Release != "" {
				fmt.Fprintf(w, "%s: %s done in %s, release %s\n", a.App, verb, d, a.Release)
			} else {
				fmt.Fprintf(w, "%s: %s done in %s\n", a.App, verb, d)
			}
		default:
			fmt.Fprintf(w, "%s: %s %s after %s: %s\n", a.App, verb, a.Outcome, d, a.Error)
			if a.ExitStatus != "" {
				fmt.Fprintf(w, "  new worker: %s\n", a.ExitStatus)
			}
			if len(a.LastLines) > 0 {
				fmt.Fprintln(w, "  its last output:")
				for _, l := range a.LastLines {
					fmt.Fprintf(w, "  | %s\n", strings.TrimRight(l, "\r"))
				}
			}
		}
	}
}

func shutdownCommand() *cli.Command {
	return &cli.Command{
		Name:    "shutdown",
		Aliases: []string{"kill"},
		Usage:   "stop every worker gracefully and stop the agent",
		Description: "Waits until the agent has stopped its workers and exited (so that a new\n" +
			"`deployd agent` can start right after), up to --timeout.",
		Flags: clientFlags(
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "wait at most `D` for the agent to exit"},
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the agent has the request"},
			&cli.StringFlag{Name: "main-pid", Usage: "systemd's $MAINPID (the unit's ExecStop=): when it is " +
				"empty the agent died, and nothing is stopped: the next agent adopts its workers"}),
		Action: func(c *cli.Context) error {
			if c.IsSet("main-pid") && strings.TrimSpace(c.String("main-pid")) == "" {
				// systemd runs ExecStop= also after the main process died
				// on its own, with $MAINPID unset; then another agent (one
				// an upgrade had started) must not be stopped.
				fmt.Fprintln(c.App.ErrWriter, "no agent to stop: the unit's main process is gone")
				return nil
			}
			cl := client(c)
			v, _ := cl.Version(ctx(c))
			if err := cl.Shutdown(ctx(c)); err != nil {
				return err
			}
			if c.Bool("no-wait") {
				fmt.Fprintln(c.App.ErrWriter, "agent is stopping its workers and will exit")
				return nil
			}
			if v == nil {
				fmt.Fprintln(c.App.ErrWriter, "agent is stopping its workers and will exit")
				return nil
			}
			deadline := time.Now().Add(c.Duration("timeout"))
			for time.Now().Before(deadline) {
				if processGone(v.PID) {
					fmt.Fprintf(c.App.ErrWriter, "agent (pid %d) stopped\n", v.PID)
					return nil
				}
				time.Sleep(50 * time.Millisecond)
			}
			return fail(ExitFailed, "the agent (pid %d) is still stopping after %s; its workers may be slow to drain", v.PID, c.Duration("timeout"))
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the CLI's version (and the running agent's, when it answers)",
		Flags: clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			b := version.VCS()
			out := map[string]any{"version": version.String(), "commit": b.Commit, "commit_time": b.Time, "dirty": b.Dirty}
			cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
			defer cancel()
			if v, err := client(c).Version(cx); err == nil {
				out["agent_version"], out["agent_pid"] = v.Version, v.PID
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(out)
			}
			fmt.Fprintf(c.App.Writer, "deployd %s\n", version.Long())
			if v, ok := out["agent_version"]; ok {
				fmt.Fprintf(c.App.Writer, "agent %s (pid %v)\n", v, out["agent_pid"])
			}
			return nil
		},
	}
}

func demoWorkerCommand() *cli.Command {
	return &cli.Command{
		Name:   "demo-worker",
		Hidden: true,
		Usage:  "the built-in hello app that `deployd demo` runs (speaks the worker contract)",
		Action: func(c *cli.Context) error {
			if err := demoapp.Run(c.App.Writer); err != nil {
				return fail(ExitFailed, "%v", err)
			}
			return nil
		},
	}
}

// processGone reports whether pid has exited (or is a zombie).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// selectEnv records environment = env in the config table of each app
// named (each app with an env_ENV table when none is).
func selectEnv(c *cli.Context, env string, names []string) error {
	path, err := configToEdit(c)
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return fail(ExitUsage, "%v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fail(ExitUsage, "%v", err)
	}
	named := len(names) > 0
	if !named {
		names = cfg.AppNames
	}
	var set []string
	for _, n := range names {
		a := cfg.Apps[n]
		switch {
		case a == nil:
			return fail(ExitUsage, "no app %q in %s", n, path)
		case env != "" && !slices.Contains(a.Environments, env):
			if named {
				return fail(ExitUsage, "%s has no [apps.%s.env_%s] table in %s: add it with the variables of %s", n, n, env, path, env)
			}
			continue
		case a.Environment == env:
			continue
		}
		if data, err = config.SetAppKey(data, n, "environment", tomlString(env)); err != nil {
			return fail(ExitUsage, "%s: %v", path, err)
		}
		set = append(set, n)
	}
	if len(set) == 0 && !named && !slices.ContainsFunc(cfg.AppNames, func(n string) bool { return cfg.Apps[n].Environment == env }) {
		return fail(ExitUsage, "no app in %s has an env_%s table", path, env)
	}
	if len(set) == 0 {
		return nil
	}
	if _, err := config.WriteEdited(path, data); err != nil {
		return fail(ExitUsage, "%v\nnothing was written to %s", err, path)
	}
	for _, n := range set {
		fmt.Fprintf(c.App.ErrWriter, "%s: environment = %q in %s\n", n, env, path)
	}
	return nil
}
