package cli

import (
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/urfave/cli/v2"
)

// deleteCommand is `deployd delete APP`, as pm2 delete: the counterpart
// of start, which adds an app to the config file.
func deleteCommand() *cli.Command {
	return &cli.Command{
		Name:      "delete",
		Aliases:   []string{"del"},
		Usage:     "remove an app from the config file and stop it (as pm2 delete)",
		ArgsUsage: "APP",
		Description: "Removes the [apps.APP] table, its sub-tables ([apps.APP.env], ...) and the comment\n" +
			"lines directly above them from the config file; the rest of the file is kept as\n" +
			"written. Then the agent stops the app's workers gracefully (a reload of APP, which\n" +
			"removes an app that left the config) and closes its listeners. Other apps are not\n" +
			"touched. The app's releases stay on disk.\n\n" +
			"Example: deployd delete api",
		Flags: clientFlags(jsonFlag, &cli.DurationFlag{Name: "timeout", Usage: "give up waiting after `D`"}),
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "APP"); err != nil {
				return err
			}
			app := c.Args().First()
			path, err := configToEdit(c)
			if err != nil {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return fail(ExitUsage, "read %s: %v", path, err)
			}
			edited, err := config.RemoveApp(data, app)
			errNoApp := err
			switch {
			case errors.Is(err, config.ErrNoApp):
				fmt.Fprintf(c.App.ErrWriter, "%s has no [apps.%s]; asking the agent to stop it if it runs\n", path, app)
			case err != nil:
				return fail(ExitUsage, "%s: %v", path, err)
			default:
				if _, err := config.WriteEdited(path, edited); err != nil {
					return fail(ExitUsage, "%v\nnothing was written to %s", err, path)
				}
				fmt.Fprintf(c.App.ErrWriter, "removed [apps.%s] from %s\n", app, path)
			}
			_, err = applyEdit(c, "delete", app, path, "")
			var se *api.StatusError
			if errors.As(err, &se) && se.Code == http.StatusNotFound && !errors.Is(errNoApp, config.ErrNoApp) {
				fmt.Fprintf(c.App.ErrWriter, "%s was not running\n", app)
				return nil
			}
			return err
		},
	}
}
