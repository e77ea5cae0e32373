package agent

import (
	"context"
	"os"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/boundedfile"
	"github.com/deployd/deployd/release/selfupdate"
)

// probeTimeout bounds `NEW version` before an upgrade.
const probeTimeout = 5 * time.Second

// maxSignature bounds a minisign signature file (one is about 300 bytes).
const maxSignature = 64 << 10

// upgradeInput is what an upgrade request gives: the new binary (nil: re-exec
// the current one) and the checks it must pass for this caller. A member
// (not root, not the agent's uid) must pass the binary as a file and have it
// signed for upgrade_public_key; paths are opened only for owners.
func upgradeInput(req api.UpgradeRequest, by Caller, settings config.Agent) (*os.File, selfupdate.Check, error) {
	owner := by.Owner
	check := selfupdate.Check{SHA256: req.SHA256, Signature: []byte(req.SignatureText),
		PublicKey: settings.UpgradePublicKey, RequireSignature: !owner, ProbeTimeout: probeTimeout}
	if !owner && (req.Binary != "" || req.Signature != "") {
		return nil, check, failWith(api.KindForbidden, "permission denied: the agent opens a path for root and its own uid only; "+
			"members of socket_group pass the file itself: use a deployd CLI of this version or later")
	}
	// A member's upgrade without a key to check its signature, or any
	// upgrade whose checks cannot pass, is refused before the binary is
	// read (or the agent waits for anything).
	if !owner || req.Signature == "" {
		if err := check.Precheck(); err != nil && (req.Attached || req.Binary != "") {
			return nil, check, err
		}
	}
	if req.Signature != "" {
		sig, err := boundedfile.ReadFile(req.Signature, boundedfile.Options{Max: maxSignature})
		if err != nil {
			return nil, check, failWith(api.KindRefused, "signature: %w", err)
		}
		check.Signature = sig
	}
	switch {
	case req.Attached:
		f, err := by.file()
		if err != nil {
			return nil, check, failWith(api.KindUsage, "%w", err)
		}
		return f, check, nil
	case req.Binary != "":
		f, err := os.Open(req.Binary)
		if err != nil {
			return nil, check, failWith(api.KindRefused, "new binary: %w", err)
		}
		return f, check, nil
	case !owner:
		return nil, check, failWith(api.KindForbidden, "permission denied: members of socket_group may upgrade the agent only to a new binary "+
			"signed for [agent] upgrade_public_key; re-executing the current binary is for root and the agent's uid %d", os.Getuid())
	}
	return nil, check, nil
}

// Upgrade hands every socket and worker to a new agent (upgrades.go): the
// binary the caller passed (by.File), one at a path for an owner, or the
// agent's own binary again. It returns once the new agent is ready (this
// one then stops) or with the refusal or failure, worded for the user.
func (a *Agent) Upgrade(ctx context.Context, req api.UpgradeRequest, by Caller) (*api.UpgradeResult, error) {
	src, check, err := upgradeInput(req, by, a.settings)
	if src != nil {
		defer src.Close()
	}
	if err == nil {
		var res *api.UpgradeResult
		if res, err = a.upgrades.run(ctx, src, check, req.RestartWorkers); err == nil {
			return res, nil
		}
	}
	prefix := "upgrade refused, nothing changed: "
	switch kindOf(err) {
	case api.KindFailed:
		prefix = "upgrade failed: "
	case api.KindBusy:
		prefix = ""
	}
	a.log.Warn("upgrade refused or failed", "error", err)
	return nil, prefixed(prefix, err)
}
