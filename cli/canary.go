package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

// canaryFlag is reload's and deploy's --canary.
var canaryFlag = &cli.IntFlag{Name: "canary", Usage: "replace only `N` workers, then hold: old and new release serve side by side " +
	"until `deployd promote APP` or `deployd abort APP` (or canary_timeout)"}

// canaryOf reads --canary.
func canaryOf(c *cli.Context) (int, error) {
	n := c.Int("canary")
	if n < 0 {
		return 0, fail(ExitUsage, "--canary %d: give the number of workers to hold on the new release, e.g. --canary 1", n)
	}
	return n, nil
}

const canaryHelp = "With --canary N only N workers (slots 0..N-1) are replaced, readiness-gated (the first\n" +
	"batch bakes min_ready), then the app HOLDS in state \"canary\": both releases serve side by\n" +
	"side, and the command returns 0 with outcome \"held\". Then `deployd promote APP` rolls the\n" +
	"rest, `deployd abort APP` puts the canaries back on the old release. Until then every other\n" +
	"operation on the app is refused. A canary that crashes or breaches max_memory (or a health\n" +
	"check) aborts the hold by itself; canary_timeout (per app) ends it with canary_action.\n"

func promoteCommand() *cli.Command {
	return &cli.Command{
		Name:      "promote",
		Usage:     "roll a held canary's release out to every worker",
		ArgsUsage: "APP",
		Description: "Ends the hold that `reload --canary N` or `deploy --canary N` started: the other\n" +
			"workers move to the canary's release, rolling and readiness-gated like a reload (the\n" +
			"canaries stay). If a new worker is not ready or exits, every worker, the canaries too,\n" +
			"goes back to the previous release. For a deployed canary the app's after hook then runs\n" +
			"(a failing one is a WARNING, the release serves: exit 0).\n\n" +
			"Exit codes: 0 promoted (also when the hold was promoted already, e.g. by canary_timeout),\n" +
			"1 the promote failed (previous release serving) or no canary is held (the message says how\n" +
			"the last one ended: a canary that crashed aborts by itself), 3 agent unreachable.\n" +
			"--json prints events, then {\"ok\",\"apps\":[{\"outcome\":\"promoted\",\"canary_end\":{...},\"hooks\":[...]}]}.\n\n" +
			"Example (CI): deployd deploy web --artifact web.tar.gz --canary 1 && ./check-metrics &&\n" +
			"  deployd promote web || deployd abort web",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D` (the promote goes on in the agent)"}),
		Action: func(c *cli.Context) error {
			return endCanary(c, "promote", func(cx context.Context, cl *api.Client, app string, on func(api.Event)) (*api.Result, error) {
				return cl.Promote(cx, app, on)
			})
		},
	}
}

func abortCommand() *cli.Command {
	return &cli.Command{
		Name:      "abort",
		Usage:     "put a held canary's workers back on the previous release",
		ArgsUsage: "APP",
		Description: "Ends the hold that `reload --canary N` or `deploy --canary N` started: each canary\n" +
			"is replaced by a worker of the previous release, readiness-gated (the new worker is ready\n" +
			"before the canary drains). A deployed release is marked failed.\n\n" +
			"Exit codes: 0 aborted (also when the hold was aborted already, e.g. by a canary's crash),\n" +
			"1 a canary could not be moved back (the message says which worker runs what) or no canary\n" +
			"is held, 3 agent unreachable. --json: outcome \"aborted\".",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"}),
		Action: func(c *cli.Context) error {
			return endCanary(c, "abort", func(cx context.Context, cl *api.Client, app string, on func(api.Event)) (*api.Result, error) {
				return cl.Abort(cx, app, on)
			})
		},
	}
}

func endCanary(c *cli.Context, verb string, call func(context.Context, *api.Client, string, func(api.Event)) (*api.Result, error)) error {
	if err := exactArgs(c, 1, "APP"); err != nil {
		return err
	}
	app := c.Args().First()
	return runStream(c, verb, func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
		return call(cx, cl, app, on)
	})
}

// printHeld tells what a held canary runs and how to end it.
func printHeld(w io.Writer, app string, cv *api.Canary) {
	if cv == nil {
		return
	}
	fmt.Fprintf(w, "%s: canary held: release %s on %s, %s on the others", app, cv.Release, slots(cv.Slots), cv.Previous)
	if cv.HeldSeconds >= 1 {
		fmt.Fprintf(w, ", for %s", fmtDuration(cv.HeldSeconds))
	}
	fmt.Fprintln(w)
	if cv.TimeoutSeconds > 0 {
		left := time.Until(cv.Since.Add(time.Duration(cv.TimeoutSeconds * float64(time.Second))))
		fmt.Fprintf(w, "  canary_timeout %s: %s in %s unless ended before\n",
			fmtDuration(cv.TimeoutSeconds), cv.Action, fmtDuration(max(left, 0).Seconds()))
	}
	if cv.Ending != "" {
		fmt.Fprintf(w, "  ending by itself: %s\n", cv.Ending)
		return
	}
	fmt.Fprintf(w, "  check it, then `deployd promote %s` (roll %s out) or `deployd abort %s` (back to %s)\n",
		app, cv.Release, app, cv.Previous)
}

// printCanaryEnd tells how a promote or abort ended.
func printCanaryEnd(w io.Writer, a api.AppResult, d time.Duration) {
	e := a.CanaryEnd
	if e.Already {
		fmt.Fprintf(w, "%s: the canary was %s already at %s by %s", a.App, a.Outcome, e.At.Local().Format(time.TimeOnly), e.By)
		if e.Reason != "" {
			fmt.Fprintf(w, " (%s)", e.Reason)
		}
		fmt.Fprintln(w, "; nothing to do")
		return
	}
	switch a.Outcome {
	case api.OutcomePromoted:
		fmt.Fprintf(w, "%s: canary promoted in %s: every worker runs %s", a.App, d, e.Release)
	case api.OutcomeAborted:
		fmt.Fprintf(w, "%s: canary aborted in %s: every worker runs %s", a.App, d, e.Previous)
	}
	if e.By != "promote" && e.By != "abort" {
		fmt.Fprintf(w, " (ended by %s at %s", e.By, e.At.Local().Format(time.TimeOnly))
		if e.Reason != "" {
			fmt.Fprintf(w, ": %s", e.Reason)
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
	for _, h := range a.Hooks {
		if !h.OK {
			fmt.Fprintf(w, "%s: WARNING: %s; the release serves (a failed after hook is not undone)\n", a.App, h.Error)
			for _, l := range h.LastLines {
				fmt.Fprintf(w, "  | %s\n", l)
			}
		}
	}
}

// slots words slot numbers: "worker 0", "workers 0, 1".
func slots(s []int) string {
	parts := make([]string, len(s))
	for i, n := range s {
		parts[i] = fmt.Sprint(n)
	}
	if len(s) == 1 {
		return "worker " + parts[0]
	}
	return "workers " + strings.Join(parts, ", ")
}

// printStatusCanary is status's text for a held canary or the last one's end.
func printStatusCanary(out io.Writer, a api.App) {
	if a.Canary != nil {
		fmt.Fprintln(out)
		printHeld(out, a.Name, a.Canary)
		return
	}
	if e := a.LastCanary; e != nil {
		serving := e.Previous
		if e.Outcome == api.OutcomePromoted {
			serving = e.Release
		}
		fmt.Fprintf(out, "\n%s: last canary (release %s) %s at %s by %s", a.Name, e.Release, e.Outcome,
			e.At.Local().Format(time.TimeOnly), e.By)
		if e.Reason != "" {
			fmt.Fprintf(out, ": %s", e.Reason)
		}
		fmt.Fprintf(out, "; %s serves\n", serving)
	}
}
