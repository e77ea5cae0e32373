package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

func upgradeCommand() *cli.Command {
	return &cli.Command{
		Name:  "upgrade",
		Usage: "replace the running agent (and optionally its binary) without dropping a connection",
		Description: "The CLI opens --binary (and --signature) as you and passes the open file to the agent,\n" +
			"which copies it beside its own binary, verifies that copy (sha256, a minisign signature\n" +
			"when [agent] upgrade_public_key is set, always for socket_group members) and only then\n" +
			"checks that its `version` answers within 5 s, swaps it in\n" +
			"at the agent's own path keeping a backup, and starts a new agent from it. Every\n" +
			"listener, the control socket and the running workers pass to the new agent, which\n" +
			"adopts the workers (same pids, no signal, their logs and notify messages read on) and\n" +
			"then takes over; the old agent exits without stopping them. With --restart-workers\n" +
			"the new agent starts new workers instead and the old one drains its own. If anything fails,\n" +
			"the previous binary is restored and the old agent keeps serving (exit 1).\n" +
			"Without --binary the agent re-executes its current binary (same as SIGHUP or\n" +
			"`systemctl reload`). One upgrade at a time; an upgrade asked for while the previous\n" +
			"agent still drains waits for it (up to upgrade_timeout).\n\n" +
			"Example: deployd upgrade --binary ./deployd-1.4.0 --sha256 $(sha256sum deployd-1.4.0 | cut -d' ' -f1)",
		Flags: clientFlags(jsonFlag,
			&cli.StringFlag{Name: "binary", Usage: "new deployd `FILE` to install at the agent's path"},
			&cli.StringFlag{Name: "sha256", Usage: "expected sha256 of --binary, `HEX`"},
			&cli.StringFlag{Name: "signature", Usage: "minisign signature `FILE` of --binary"},
			&cli.BoolFlag{Name: "restart-workers", Usage: "start new workers for every app (rolling, readiness-gated) instead of adopting the running ones"},
		),
		Action: runUpgrade,
	}
}

// runUpgrade reads --binary and --signature as the caller and passes them
// to the agent; every refusal exits 1.
func runUpgrade(c *cli.Context) error {
	if c.NArg() > 0 {
		return fail(ExitUsage, "usage: deployd upgrade [--binary FILE] [--sha256 HEX] [--signature FILE]")
	}
	req := api.UpgradeRequest{SHA256: c.String("sha256"), RestartWorkers: c.Bool("restart-workers")}
	bin, sig := c.String("binary"), c.String("signature")
	if (req.SHA256 != "" || sig != "") && bin == "" {
		return fail(ExitUsage, "--sha256 and --signature need --binary")
	}
	// The CLI reads both files as the caller; the agent never opens them.
	var f *os.File
	if bin != "" {
		var err error
		if f, err = os.Open(bin); err != nil {
			return fail(ExitFailed, "upgrade refused, nothing changed: --binary: %v", err)
		}
		defer f.Close()
	}
	if sig != "" {
		b, err := os.ReadFile(sig)
		if err != nil {
			return fail(ExitFailed, "upgrade refused, nothing changed: --signature: %v", err)
		}
		req.SignatureText = string(b)
	}
	cl := client(c)
	res, err := cl.Upgrade(ctx(c), req, f)
	var se *api.StatusError
	if errors.As(withHint(err, upgradeHints), &se) {
		return fail(ExitFailed, "%s", se.Message)
	}
	if err != nil {
		return err
	}
	if v := waitNewAgent(ctx(c), cl, res.OldPID); v != nil {
		res.NewPID, res.NewVersion = v.PID, v.Version
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(res)
	}
	fmt.Fprintf(c.App.ErrWriter, "agent upgraded: %s (pid %d) -> %s (pid %d) in %s\n", res.OldVersion, res.OldPID,
		res.NewVersion, res.NewPID, time.Duration(res.DurationSeconds*float64(time.Second)).Round(time.Millisecond))
	return nil
}

// waitNewAgent waits until the control socket is answered by an agent other
// than oldPID (the old one stops serving it while it drains) and returns
// its version, or nil after 30 s.
func waitNewAgent(cx context.Context, cl *api.Client, oldPID int) *api.VersionInfo {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if v, err := cl.Version(cx); err == nil && v.PID != oldPID {
			return v
		}
		select {
		case <-cx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
