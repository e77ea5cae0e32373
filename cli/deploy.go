package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

var strategyFlag = &cli.StringFlag{Name: "strategy", Value: "rolling", Usage: "rolling or blue-green"}

func deployCommand() *cli.Command {
	return &cli.Command{
		Name:      "deploy",
		Usage:     "install a release of an app and roll the app to it (a CI/CD pipeline step)",
		ArgsUsage: "APP",
		Description: "The artifact is an executable file, a folder or a .tar.gz. The CLI reads it as you and\n" +
			"passes it to the agent (a folder as a tar stream), so you can deploy only what you can read.\n" +
			"It is verified (--sha256),\n" +
			"installed into state_dir/releases/APP/VERSION (VERSION defaults to the first 12 hex\n" +
			"digits of its sha256) and the app is rolled to it with a readiness-gated reload.\n" +
			"The app needs `releases = true`; its workers run in the release folder, where a\n" +
			"relative command (command = [\"./server\"]) resolves.\n\n" +
			canaryHelp + "The release becomes current (state.json, `releases`) only when promoted; an\n" +
			"aborted canary marks it failed.\n\n" +
			"The app's [apps.APP.hooks] run in the release folder: before (a failure refuses the\n" +
			"deploy, nothing changed) ahead of any worker, after once the release serves (a\n" +
			"failure is reported, not undone; with --canary, at promote).\n\n" +
			"Blocks until done (with --canary: until the hold starts). Exit codes: 0 deployed or\n" +
			"canary held, 1 failed (the release is marked failed and the previous one keeps serving)\n" +
			"or refused (by the before hook, or a held canary: promote or abort it), 2 bad input\n" +
			"(nothing changed), 3 agent unreachable. --json prints events, then {\"app\",\"version\",\n" +
			"\"previous\",\"status\",\"duration_seconds\",\"hooks\"} (status \"deployed\", \"held\" with\n" +
			"\"canary\":{...}, \"failed\", \"refused\").\n\n" +
			"Examples: deployd deploy web --artifact build/web.tar.gz --version 1.4.2 --json\n" +
			"          deployd deploy web --artifact build/web.tar.gz --canary 1 && ./check &&\n" +
			"            deployd promote web || deployd abort web",
		Flags: clientFlags(jsonFlag, strategyFlag, canaryFlag,
			&cli.StringFlag{Name: "artifact", Usage: "`PATH` of an executable, a folder or a .tar.gz (required)"},
			&cli.StringFlag{Name: "version", Usage: "release `NAME` (default: first 12 hex digits of the sha256)"},
			&cli.StringFlag{Name: "sha256", Usage: "expected sha256 of the artifact, `HEX`"},
			&cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D` (the deploy goes on in the agent)"},
		),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP --artifact PATH [--version V] [--sha256 HEX]"); err != nil {
				return err
			}
			if c.String("artifact") == "" {
				return fail(ExitUsage, "--artifact is required: an executable file, a folder or a .tar.gz")
			}
			n, err := canaryOf(c)
			if err != nil {
				return err
			}
			req := api.DeployRequest{App: c.Args().First(), Version: c.String("version"),
				SHA256: c.String("sha256"), Strategy: c.String("strategy"), Canary: n}
			art, err := openArtifact(c.String("artifact"), &req)
			if err != nil {
				return err
			}
			defer art.close()
			err = runDeploy(c, "deploy", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.DeployResult, error) {
				res, err := cl.Deploy(cx, req, art.f, on)
				if perr := art.close(); perr != nil && err != nil {
					return nil, fail(ExitUsage, "--artifact %s: %v; nothing changed", c.String("artifact"), perr)
				}
				return res, err
			})
			return deployHint(err)
		},
	}
}

func rollbackCommand() *cli.Command {
	return &cli.Command{
		Name:      "rollback",
		Usage:     "roll an app back to its previous release (or --to VERSION)",
		ArgsUsage: "APP",
		Description: "A readiness-gated reload to the previous good release, or to --to. Exit codes as\n" +
			"for deploy. Example: deployd rollback web --to 1.4.1",
		Flags: clientFlags(jsonFlag, strategyFlag,
			&cli.StringFlag{Name: "to", Usage: "release `VERSION` to go to (default: the previous one)"},
			&cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"},
		),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP [--to VERSION]"); err != nil {
				return err
			}
			req := api.RollbackRequest{App: c.Args().First(), To: c.String("to"), Strategy: c.String("strategy")}
			return runDeploy(c, "rollback", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.DeployResult, error) {
				return cl.Rollback(cx, req, on)
			})
		},
	}
}

// runDeploy runs a deploy or a rollback, printing progress and its outcome.
func runDeploy(c *cli.Context, verb string, call opCall[*api.DeployResult]) error {
	res, enc, err := callOp(c, verb, call)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		_ = enc.Encode(res)
	} else {
		d := time.Duration(res.DurationSeconds * float64(time.Second)).Round(time.Millisecond)
		switch res.Status {
		case api.DeployFailed:
			fmt.Fprintf(c.App.ErrWriter, "%s: %s of %s FAILED after %s: %s\n", res.App, verb, res.Version, d, res.Error)
			if res.ExitStatus != "" {
				fmt.Fprintf(c.App.ErrWriter, "  new worker: %s\n", res.ExitStatus)
			}
			for _, l := range res.LastLines {
				fmt.Fprintf(c.App.ErrWriter, "  | %s\n", l)
			}
			if res.Previous != "" {
				fmt.Fprintf(c.App.ErrWriter, "  %s keeps serving; the release is marked failed\n", res.Previous)
			}
		case api.DeployHeld:
			printHeld(c.App.ErrWriter, res.App, res.Canary)
		case api.DeployRefused:
			fmt.Fprintf(c.App.ErrWriter, "%s: %s of %s REFUSED after %s: %s\n", res.App, verb, res.Version, d, res.Error)
			printLines(c, res.LastLines)
		case api.DeployUnchanged:
			fmt.Fprintf(c.App.ErrWriter, "%s: %s is the current release already; nothing to do\n", res.App, res.Version)
		default:
			prev := res.Previous
			if prev == "" {
				prev = "none"
			}
			fmt.Fprintf(c.App.ErrWriter, "%s: %s %s in %s (previous: %s)\n", res.App, res.Status, res.Version, d, prev)
			for _, h := range res.Hooks {
				if !h.OK {
					fmt.Fprintf(c.App.ErrWriter, "%s: WARNING: %s; the release serves (a failed after hook is not undone)\n", res.App, h.Error)
					printLines(c, h.LastLines)
				}
			}
		}
	}
	if res.Status == api.DeployFailed || res.Status == api.DeployRefused {
		return fail(ExitFailed, "")
	}
	return nil
}

// printLines prints a process's last lines of output, indented.
func printLines(c *cli.Context, lines []string) {
	for _, l := range lines {
		fmt.Fprintf(c.App.ErrWriter, "  | %s\n", l)
	}
}

func releasesCommand() *cli.Command {
	return &cli.Command{
		Name:      "releases",
		Usage:     "list the releases of an app on this host",
		ArgsUsage: "APP",
		Flags:     clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP"); err != nil {
				return err
			}
			rs, err := client(c).Releases(ctx(c), c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(rs)
			}
			if len(rs.Releases) == 0 {
				fmt.Fprintf(c.App.Writer, "%s has no releases yet; deploy one with `deployd deploy %s --artifact PATH`\n", rs.App, rs.App)
				return nil
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tINSTALLED\tSHA256\tSIZE\tSTATUS")
			for _, r := range rs.Releases {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Version, r.InstalledAt.Local().Format(time.DateTime),
					strings.TrimSpace(r.SHA256[:min(12, len(r.SHA256))]), fmtBytes(r.Size), r.Status)
			}
			return tw.Flush()
		},
	}
}
