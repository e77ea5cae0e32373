package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show apps and their workers",
		ArgsUsage: "[APP]",
		Description: "Shows each worker's slot, pid, state (starting, ready, draining, stopping,\n" +
			"exited), release, uptime, restarts, CPU and memory. An errored app shows its\n" +
			"last exit and output. An app holding a canary (state \"canary\") shows which workers\n" +
			"run which release, how long it has held and its canary_timeout; after the hold, how\n" +
			"it ended. Old workers a reload replaced that still drain in the background (long-lived\n" +
			"connections, bounded by stop_timeout) follow their app's workers as \"draining\", each\n" +
			"with the TCP connections on the app's listeners it still holds (\"unknown\" where the\n" +
			"agent may not read the worker's /proc/PID/fd: run it as root).\n" +
			"An app with balance even or sticky lists each worker's new connections and the\n" +
			"connections waiting in its own accept queue; any app, a listener's accept queue\n" +
			"when connections wait in it (read once a second).\n" +
			"--json prints the same as one JSON object (\"canary\", \"last_canary\", \"draining\";\n" +
			"a draining worker's \"connections\", absent when unknown; \"accept_queues\" per\n" +
			"listener; a steered worker's \"new_connections\" and \"queued\").",
		Flags: clientFlags(jsonFlag,
			&cli.DurationFlag{Name: "watch", Usage: "refresh every `INTERVAL` (e.g. 1s) until Ctrl-C"}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fail(ExitUsage, "usage: deployd status [APP]")
			}
			cl := client(c)
			for first := true; ; first = false {
				st, err := cl.Status(ctx(c), c.Args().First())
				if err != nil {
					return err
				}
				if c.Bool("json") {
					enc := json.NewEncoder(c.App.Writer)
					enc.SetIndent("", "  ")
					if err := enc.Encode(st); err != nil {
						return err
					}
				} else {
					watchHeader(c.App.Writer, c.Duration("watch"), first)
					printStatus(c.App.Writer, st)
				}
				if c.Duration("watch") <= 0 {
					return nil
				}
				select {
				case <-ctx(c).Done():
					return nil
				case <-time.After(c.Duration("watch")):
				}
			}
		},
	}
}

func printStatus(out io.Writer, st *api.Status) {
	fmt.Fprintf(out, "agent %s pid %d up %s, rss %s, socket %s\n\n", st.Agent.Version, st.Agent.PID,
		fmtDuration(st.Agent.UptimeSeconds), fmtBytes(st.Agent.RSSBytes), st.Agent.Socket)
	if len(st.Apps) == 0 {
		fmt.Fprintln(out, "no apps configured; add one with `deployd start app.js` or an [apps.NAME] table in the config")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APP\tSLOT\tPID\tSTATE\tRELEASE\tGEN\tUPTIME\tRESTARTS\tCPU\tRSS")
	for _, a := range st.Apps {
		if len(a.Workers) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t%s\t-\t-\t%d\t-\t-\n", a.Name, a.State, a.Release, a.Restarts)
		}
		for _, w := range a.Workers {
			state := w.State
			if w.Spare {
				state += " (spare)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%s\t%d\t%.1f%%\t%s\n", a.Name, w.Slot, w.PID, state,
				w.Release, w.Generation, fmtDuration(w.UptimeSeconds), w.Restarts, w.CPUPercent, fmtBytes(w.RSSBytes))
		}
		// Old workers draining in the background: no longer in a slot
		// (their restarts are the slot's), shown with the slot they served.
		for _, w := range a.Draining {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%s\t-\t%.1f%%\t%s\n", a.Name, w.Slot, w.PID, w.State,
				w.Release, w.Generation, fmtDuration(w.UptimeSeconds), w.CPUPercent, fmtBytes(w.RSSBytes))
		}
	}
	tw.Flush()
	for _, a := range st.Apps {
		if a.Balance == "even" || a.Balance == "sticky" {
			fmt.Fprintf(out, "\n%s: balance %s (a socket per worker, steered by the kernel)\n", a.Name, a.Balance)
		}
		printAcceptQueues(out, a)
		if p := a.Paused; p != nil {
			ends := "until `deployd resume " + a.Name + "`"
			if p.EndsInSeconds != nil {
				ends = "resumes by itself in " + fmtDuration(*p.EndsInSeconds) + ", or at `deployd resume " + a.Name + "`"
			}
			fmt.Fprintf(out, "\n%s: PAUSED for %s: %d new connections wait in the kernel (backlog %d); %s\n",
				a.Name, fmtDuration(p.SinceSeconds), p.Queued, p.Backlog, ends)
		}
		for _, w := range a.Warnings {
			fmt.Fprintf(out, "\n%s: warning: listener %s\n", a.Name, w)
		}
		if a.DroppedLogLines > 0 {
			fmt.Fprintf(out, "\n%s: %d log lines dropped (log_dir full or too slow; the log marks where)\n", a.Name, a.DroppedLogLines)
		}
		printStatusCanary(out, a)
		printRecycle(out, a)
		switch a.State {
		case "running", "canary":
		case "no release":
			fmt.Fprintf(out, "\n%s has no release yet; deploy one with `deployd deploy %s --artifact PATH`\n", a.Name, a.Name)
		default:
			fmt.Fprintf(out, "\n%s is %s", a.Name, a.State)
			if a.State == "errored" {
				fmt.Fprint(out, " (crashed too often; fix it, then `deployd restart "+a.Name+"`)")
			}
			if a.State == "stopped" {
				fmt.Fprint(out, " (`deployd start "+a.Name+"` starts it)")
			}
			fmt.Fprintln(out)
		}
		for _, w := range a.Workers {
			// What a worker said about itself (sd_notify STATUS=, or the
			// Node.js integration's error) while it is not serving.
			if w.Status != "" && w.State != "ready" {
				fmt.Fprintf(out, "%s[%d] pid %d: %s\n", a.Name, w.Slot, w.PID, w.Status)
			}
			printHealth(out, a.Name, w)
		}
		printDrainingConnections(out, a)
		switch {
		case a.LastExit == "":
		case a.State == "errored":
			fmt.Fprintf(out, "last exit: %s\n", a.LastExit)
			for _, l := range a.LastLines {
				fmt.Fprintf(out, "  | %s\n", l)
			}
		case crashing(a) && len(a.LastLines) > 0:
			fmt.Fprintf(out, "\n%s: last exit: %s\n  | %s\n", a.Name, a.LastExit, a.LastLines[len(a.LastLines)-1])
		case crashing(a):
			fmt.Fprintf(out, "\n%s: last exit: %s\n", a.Name, a.LastExit)
		}
	}
}

// printAcceptQueues shows, of a steered app, each worker's new
// connections and its own accept queue, and each listener's total; of a
// shared one, a listener's queue only when connections wait in it.
func printAcceptQueues(out io.Writer, a api.App) {
	steered := a.Balance == "even" || a.Balance == "sticky"
	if steered {
		for _, w := range a.Workers {
			conns := "spare"
			if w.NewConnections != nil {
				conns = fmt.Sprintf("%d new connections", *w.NewConnections)
			} else if !w.Spare {
				conns = "new connections unknown"
			}
			queued := "accept queue unknown"
			if w.Queued != nil {
				queued = fmt.Sprintf("%d queued", *w.Queued)
			}
			fmt.Fprintf(out, "  %s[%d] pid %d: %s, %s\n", a.Name, w.Slot, w.PID, conns, queued)
		}
	}
	for _, q := range a.AcceptQueues {
		switch {
		case steered:
			fmt.Fprintf(out, "  listener %s: %d queued (backlog %d)\n", q.Listen, q.Queued, q.Backlog)
		case q.Queued > 0:
			fmt.Fprintf(out, "\n%s: %d connections wait in the accept queue of %s (backlog %d)\n", a.Name, q.Queued, q.Listen, q.Backlog)
		}
	}
}

// printDrainingConnections says how many connections each draining
// worker still holds: what keeps it from exiting before stop_timeout.
func printDrainingConnections(out io.Writer, a api.App) {
	for _, w := range a.Draining {
		switch {
		case w.Connections == nil:
			fmt.Fprintf(out, "%s[%d] pid %d draining: open connections unknown (the agent may not read /proc/%d/fd; run it as root)\n",
				a.Name, w.Slot, w.PID, w.PID)
		case *w.Connections == 1:
			fmt.Fprintf(out, "%s[%d] pid %d draining: 1 open connection\n", a.Name, w.Slot, w.PID)
		default:
			fmt.Fprintf(out, "%s[%d] pid %d draining: %d open connections\n", a.Name, w.Slot, w.PID, *w.Connections)
		}
	}
}

// printHealth says what the health check of w last failed on, and how
// often a worker of its slot was replaced for failing it.
func printHealth(out io.Writer, app string, w api.Worker) {
	switch {
	case w.HealthError != "" && w.State == "starting":
		fmt.Fprintf(out, "%s[%d] pid %d: not ready yet, health check: %s\n", app, w.Slot, w.PID, w.HealthError)
	case w.HealthError != "":
		fmt.Fprintf(out, "%s[%d] pid %d: health check failing (%d in a row, %d in all): %s\n",
			app, w.Slot, w.PID, w.HealthFailures, w.HealthFailuresTotal, w.HealthError)
	}
	if w.HealthReplacements > 0 {
		fmt.Fprintf(out, "%s[%d]: replaced %d times for failing its health check\n", app, w.Slot, w.HealthReplacements)
	}
}

// crashing reports whether a worker of a has crashed and is not serving
// again yet: exited (a restart is due), or restarted and still starting.
func crashing(a api.App) bool {
	for _, w := range a.Workers {
		if w.State == "exited" || (w.State == "starting" && w.Restarts > 0) {
			return true
		}
	}
	return false
}

func fmtDuration(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func fmtBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%siB", float64(b)/float64(div), strings.Split("K M G T", " ")[exp])
}

// watchHeader starts each refresh of `status --watch`: on a terminal it
// clears the screen; into a pipe or a file it writes no control codes, only
// a blank line and the time between refreshes.
func watchHeader(w io.Writer, every time.Duration, first bool) {
	switch {
	case every <= 0:
	case isTerminal(w):
		fmt.Fprint(w, "\033[H\033[2J")
	case !first:
		fmt.Fprintf(w, "\n--- %s\n", time.Now().Format(time.TimeOnly))
	}
}

// printRecycle says which worker recycle_after or recycle_at replaces
// next, and when: of those due at the same time (recycle_at gives a pool
// one), the oldest, as the agent takes them.
func printRecycle(out io.Writer, a api.App) {
	var next *api.Worker
	for i, w := range a.Workers {
		if w.RecycleInSeconds == nil {
			continue
		}
		if next == nil || *w.RecycleInSeconds < *next.RecycleInSeconds ||
			*w.RecycleInSeconds == *next.RecycleInSeconds && w.UptimeSeconds > next.UptimeSeconds {
			next = &a.Workers[i]
		}
	}
	if next != nil {
		by := next.RecycleBy
		if by == "" { // an older agent's status
			by = "recycle_after"
		}
		fmt.Fprintf(out, "\n%s: %s: worker %d (pid %d) is replaced next, in %s\n",
			a.Name, by, next.Slot, next.PID, fmtDuration(*next.RecycleInSeconds))
	}
}
