package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

func importCommand() *cli.Command {
	return &cli.Command{
		Name:  "import",
		Usage: "convert another process manager's config into deployd.toml",
		Subcommands: []*cli.Command{{
			Name:      "pm2",
			Usage:     "write the deployd.toml equivalent of a PM2 ecosystem file (evaluated with node)",
			ArgsUsage: "ecosystem.config.js",
			Description: "Prints the apps of the ecosystem file as deployd.toml tables, or with -o writes\n" +
				"them to a file of their own. --apply adds them to the config file of the agent\n" +
				"on the socket instead (the file `deployd start` edits; the rest of the file is\n" +
				"kept as written) and starts them. What has no deployd equivalent is listed as\n" +
				"\"not mapped\" on stderr.\n\n" +
				"Examples: deployd import pm2 ecosystem.config.js --apply\n" +
				"          deployd import pm2 ecosystem.config.js -o deployd.toml && deployd agent -c deployd.toml",
			Flags: clientFlags(
				&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write to `FILE` instead of stdout"},
				&cli.BoolFlag{Name: "apply", Usage: "add the apps to the agent's config file and start them"},
				&cli.StringFlag{Name: "env", Usage: "select env_`NAME` (environment = \"NAME\", as pm2 start --env NAME); every env_NAME becomes an [apps.APP.env_NAME] table"},
			),
			Action: runImportPM2,
		}},
	}
}

// pm2Eval prints the apps of an ecosystem file as JSON (CommonJS, JSON, or
// an ES module through import()).
const pm2Eval = `const path = require('path'), url = require('url');
const file = path.resolve(process.argv[1]);
(async () => {
  let m;
  try { m = require(file); } catch (e) {
    if (e.code !== 'ERR_REQUIRE_ESM') throw e;
    m = await import(url.pathToFileURL(file).href);
  }
  if (m && m.default) m = m.default;
  const apps = Array.isArray(m) ? m : (m && Array.isArray(m.apps) ? m.apps : [m]);
  process.stdout.write(JSON.stringify(apps));
})().catch((e) => { console.error(e && e.message || e); process.exit(1); });
`

func runImportPM2(c *cli.Context) error {
	if c.NArg() != 1 {
		return fail(ExitUsage, "deployd import pm2 needs one ecosystem file, e.g. deployd import pm2 ecosystem.config.js")
	}
	file := c.Args().First()
	if _, err := os.Stat(file); err != nil {
		return fail(ExitUsage, "%v", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return fail(ExitFailed, "node is needed to evaluate %s: install Node.js, or write deployd.toml by hand (docs/coming-from-pm2.md)", file)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("node", "-e", pm2Eval, file)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fail(ExitFailed, "evaluating %s with node: %v: %s", file, err, strings.TrimSpace(stderr.String()))
	}
	var apps []map[string]any
	if err := json.Unmarshal(out, &apps); err != nil {
		return fail(ExitFailed, "%s: its apps are not a list of objects: %v", file, err)
	}
	var toml strings.Builder
	fmt.Fprintf(&toml, "# Converted from %s by `deployd import pm2`.\n", filepath.Base(file))
	var notes []string
	tables := make([]importedApp, 0, len(apps))
	for i, app := range apps {
		text, n := pm2App(app, i, c.String("env"), filepath.Dir(file))
		toml.WriteString("\n" + text)
		notes = append(notes, n...)
		tables = append(tables, importedApp{name: pm2Name(app, i), text: text})
	}
	defer func() { // after what was written or applied, in order
		for _, n := range notes {
			fmt.Fprintln(c.App.ErrWriter, "not mapped: "+n)
		}
	}()
	if c.Bool("apply") {
		if c.IsSet("output") {
			return fail(ExitUsage, "--apply adds the apps to the agent's config file; -o writes a file of their own: use one")
		}
		return applyImport(c, file, tables)
	}
	if o := c.String("output"); o != "" {
		if err := os.WriteFile(o, []byte(toml.String()), 0o644); err != nil {
			return fail(ExitFailed, "%v", err)
		}
		noteOtherAgentFile(c, o, file)
	} else {
		fmt.Fprint(c.App.Writer, toml.String())
	}
	return nil
}

// importedApp is one converted app: its name and its [apps.NAME] text.
type importedApp struct{ name, text string }

// applyImport adds the converted apps to the agent's config file (all or
// none: an app already there changes nothing) and reloads them, which
// starts them.
func applyImport(c *cli.Context, file string, apps []importedApp) error {
	path, err := configToEdit(c)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(ExitUsage, "read %s: %v", path, err)
	}
	names := make([]string, 0, len(apps))
	for i, a := range apps {
		block := a.text
		if i == 0 {
			block = fmt.Sprintf("# added by `deployd import pm2 %s --apply`\n", filepath.Base(file)) + block
		}
		edited, err := config.AppendApp(data, a.name, block)
		if errors.Is(err, config.ErrAppExists) {
			return fail(ExitUsage, "app %q is already in %s: remove it first (deployd delete %s) or import with -o into a file of its own; nothing was written",
				a.name, path, a.name)
		}
		if err != nil {
			return fail(ExitUsage, "%s: %v; nothing was written", path, err)
		}
		data = edited
		names = append(names, a.name)
	}
	if _, err := config.WriteEdited(path, data); err != nil {
		return fail(ExitUsage, "%v\nnothing was written to %s", err, path)
	}
	fmt.Fprintf(c.App.ErrWriter, "added [apps.%s] to %s\n", strings.Join(names, "], [apps."), path)
	err = runStream(c, "start", func(cx context.Context, cl *api.Client, on func(api.Event)) (*api.Result, error) {
		return cl.Reload(cx, api.ReloadRequest{Apps: names}, on)
	})
	if exitCodeOf(err) == ExitUnreachable {
		fmt.Fprintf(c.App.ErrWriter, "the agent does not answer (%v); it starts them when it starts: deployd agent -c %s\n", err, path)
		return nil
	}
	return err
}

// noteOtherAgentFile says so when the agent on the socket runs another
// file than out, which import -o just wrote: that agent never reads out,
// and a reload there does not start its apps.
func noteOtherAgentFile(c *cli.Context, out, ecosystem string) {
	cx, cancel := context.WithTimeout(ctx(c), 2*time.Second)
	st, err := client(c).Status(cx, "")
	cancel()
	if err != nil || st.Agent.Config == "" || sameFile(st.Agent.Config, out) {
		return
	}
	fmt.Fprintf(c.App.ErrWriter, "note: the agent on %s runs %s, not %s, and does not start these apps: "+
		"add them to its file and start them with `deployd import pm2 %s --apply`, or run an agent for %s: deployd agent -c %s --socket PATH\n",
		st.Agent.Socket, st.Agent.Config, out, ecosystem, out, out)
}
