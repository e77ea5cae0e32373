package cli

import (
	"context"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

func scaleCommand() *cli.Command {
	return &cli.Command{
		Name:      "scale",
		Usage:     "change an app's number of workers, live (persisted across restarts)",
		ArgsUsage: "APP N|+N|-N | APP --reset",
		Description: "Scaling up starts new workers and waits until they are ready; scaling down\n" +
			"drains the highest slots gracefully. The count is kept in state.json and\n" +
			"overrides the config's instances, also after a reload, until the next scale;\n" +
			"--reset goes back to the config's instances (and follows them from then on).\n\n" +
			"Examples: deployd scale web 4; deployd scale web +1; deployd scale web -1\n" +
			"          deployd scale web --reset",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"},
			&cli.BoolFlag{Name: "reset", Usage: "go back to the config's instances"}),
		Action: func(c *cli.Context) error {
			var app, n string
			if c.Bool("reset") {
				if err := exactArgs(c, 1, "APP --reset"); err != nil {
					return err
				}
				app, n = c.Args().Get(0), api.ScaleReset
			} else {
				if err := exactArgs(c, 2, "APP N|+N|-N, or APP --reset"); err != nil {
					return err
				}
				app, n = c.Args().Get(0), c.Args().Get(1)
			}
			app, err := appArg(c, app)
			if err != nil {
				return err
			}
			return runStream(c, "scale", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
				return cl.Scale(cx, app, n, on)
			})
		},
	}
}

func stopCommand() *cli.Command {
	return &cli.Command{
		Name:      "stop",
		Usage:     "stop every worker of an app and keep it stopped (persisted) until `deployd start`",
		ArgsUsage: "APP",
		Description: "Workers get their stop signal, then SIGKILL after stop_timeout. The app's\n" +
			"listeners stay open: connections wait in the queue until `deployd start`.",
		Flags: clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			return eachAppArg(c, "APP|all", func(app string) error {
				return runStream(c, "stop", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
					return cl.StopApp(cx, app, on)
				})
			})
		},
	}
}

func pauseCommand() *cli.Command {
	return &cli.Command{
		Name:      "pause",
		Usage:     "hold an app's new connections in the kernel until `deployd resume` (balance even or sticky)",
		ArgsUsage: "APP",
		Description: "New connections complete their handshake and wait in the kernel's accept queue\n" +
			"(up to the listen backlog, net.core.somaxconn); the workers go on with the\n" +
			"connections they have. `deployd resume APP`, or --max passing, hands the\n" +
			"waiting connections to the workers in order: none is refused. Nothing sits on\n" +
			"the data path. Needs balance = \"even\" or \"sticky\" (kernel steering); a shared\n" +
			"app is refused. `deployd status` shows the pause and how many connections wait.\n" +
			"Pausing a paused app sets its new --max. An agent upgrade or stop resumes.\n\n" +
			"Examples: deployd pause web --max 30s   # run a migration, then: deployd resume web",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "max", Usage: "resume by itself after `D` (default: only at deployd resume)"}),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP"); err != nil {
				return err
			}
			app, max := c.Args().First(), c.Duration("max")
			if max < 0 {
				return fail(ExitUsage, "--max %s: give a positive duration, e.g. --max 30s", max)
			}
			return runStream(c, "pause", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
				return cl.Pause(cx, app, max, on)
			})
		},
	}
}

func resumeCommand() *cli.Command {
	return &cli.Command{
		Name:        "resume",
		Usage:       "end an app's pause: the connections that waited are served first",
		ArgsUsage:   "APP",
		Description: "Example: deployd resume web",
		Flags:       clientFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP"); err != nil {
				return err
			}
			app := c.Args().First()
			return runStream(c, "resume", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
				return cl.Resume(cx, app, on)
			})
		},
	}
}
