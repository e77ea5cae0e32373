package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/boundedfile"
	"github.com/deployd/deployd/internal/failpoint"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/release/selfupdate"
)

// probeTimeout bounds `NEW version` before an upgrade.
const probeTimeout = 5 * time.Second

// maxSignature bounds a minisign signature file (one is about 300 bytes).
const maxSignature = 64 << 10

// errUpgradeBusy is returned when an upgrade is already running.
var errUpgradeBusy = errors.New("an agent upgrade is already running; wait for it to finish")

// upgrade hands every socket to a new agent started from the binary at the
// agent's path, after checking that the config on disk is valid. With src
// (the new binary, as a file the caller opened), its bytes are verified
// (check), written beside the agent's binary, probed and swapped in, and the
// previous binary is restored if anything fails. It returns when the new
// agent is ready (this agent then drains and exits) or has failed (this one
// keeps serving).
//
// The new agent adopts the running workers (handover.go) unless
// restartWorkers: then it starts its own and this one drains its workers.
func (a *Agent) upgrade(ctx context.Context, src *os.File, check selfupdate.Check, restartWorkers bool) (*api.UpgradeResult, error) {
	if !a.upgrading.TryLock() {
		return nil, errUpgradeBusy
	}
	defer a.upgrading.Unlock()
	// tableflip refuses an upgrade before this agent is ready.
	select {
	case <-a.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := a.heldApp(); err != nil {
		return nil, err
	}
	if err := a.hooks.wait(ctx); err != nil {
		return nil, err
	}
	if err := a.busyApp(restartWorkers); err != nil {
		return nil, err
	}
	res := &api.UpgradeResult{OldVersion: version.String(), OldPID: os.Getpid(), NewVersion: version.String()}
	if err := a.waitParent(ctx); err != nil {
		return nil, err
	}
	if _, err := config.Load(a.path); err != nil {
		return nil, failWith(api.KindRefused, "the config on disk is invalid, so a new agent could not start; fix it first:\n%w", err)
	}
	swapped := false
	if src != nil {
		cand, err := selfupdate.Prepare(src, a.shim, check)
		if err != nil {
			return nil, err
		}
		if err := cand.Commit(); err != nil {
			return nil, err
		}
		res.NewVersion, swapped = cand.Version, true
		a.log.Info("upgrade: new binary in place", "path", a.shim, "version", cand.Version,
			"sha256", fmt.Sprintf("%x", cand.SHA256), "backup", selfupdate.Backup(a.shim))
	}
	a.log.Info("upgrade: starting a new agent", "binary", a.shim)
	t := time.Now()
	h, err := a.handOver(restartWorkers)
	if err != nil {
		// Refused before a new agent started: an operation began meanwhile.
		if swapped {
			if rerr := selfupdate.Restore(a.shim); rerr != nil {
				err = fmt.Errorf("%w; restoring the previous binary FAILED: %v", err, rerr)
			}
		}
		return nil, err
	}
	if err = a.upg.Upgrade(); err != nil {
		h.failed()
	} else {
		h.succeeded()
	}
	if err != nil {
		// The new agent may have told systemd it is the main pid before it
		// died: systemd would take the service for dead at the next look
		// (a reload's `kill -HUP $MAINPID`, a stop) and start another
		// agent beside this one. This one is the main pid again.
		notify("MAINPID=" + fmt.Sprint(os.Getpid()) + "\nSTATUS=serving (an agent upgrade failed)")
		msg := fmt.Sprintf("the new agent did not get ready (%v); this agent (pid %d) keeps serving", err, os.Getpid())
		if swapped {
			if rerr := selfupdate.Restore(a.shim); rerr != nil {
				msg += "; restoring the previous binary FAILED: " + rerr.Error()
			} else {
				msg += "; the previous binary is restored"
			}
		}
		a.log.Error("upgrade failed", "error", msg)
		return nil, errors.New(msg)
	}
	res.DurationSeconds = time.Since(t).Seconds()
	a.log.Info("upgrade: new agent ready; this one exits", "new_version", res.NewVersion, "in", time.Since(t).Round(time.Millisecond))
	return res, nil
}

// busyApp refuses an upgrade, before anything changed, while an operation
// runs on an app (a reload, deploy, restart, scale or stop, or a monitor's
// replacement): the next agent takes every app over as it is, and a pool
// mid-operation has no state to hand over. The handover checks again
// (handOver) for an operation that begins meanwhile. With restartWorkers
// the next agent starts every app afresh, and this one stops the running
// operations with their workers.
func (a *Agent) busyApp(restartWorkers bool) error {
	if restartWorkers {
		return nil
	}
	for _, rt := range a.appList() {
		if !rt.busy.TryLock() {
			return failWith(api.KindBusy, "app %s: a reload, deploy, restart, scale or stop of it is running; "+
				"an agent upgrade takes every app over as it is, but not in the middle of an operation: "+
				"wait for it to finish, then upgrade", rt.name)
		}
		rt.busy.Unlock()
		if be := rt.sup.Status().Busy; be != nil {
			return failWith(api.KindBusy, "app %s: %s is running since %s; an agent upgrade takes every app over as it is, "+
				"but not in the middle of an operation: wait for it to finish, then upgrade",
				rt.name, be.Op, be.Since.Format(time.TimeOnly))
		}
	}
	return nil
}

// waitParent waits (bounded) for a predecessor that still drains: a new
// agent cannot hand off before (tableflip#52).
func (a *Agent) waitParent(ctx context.Context) error {
	if !a.upg.HasParent() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, a.settings.UpgradeTimeout)
	defer cancel()
	err := a.upg.WaitForParent(wctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the previous agent is still draining its workers after upgrade_timeout %s; try again later",
			a.settings.UpgradeTimeout)
	}
	if err != nil {
		return fmt.Errorf("wait for the previous agent to exit: %w", err)
	}
	return nil
}

// upgradeInput is what an upgrade request gives: the new binary (nil: re-exec
// the current one) and the checks it must pass for this caller. A member
// (not root, not the agent's uid) must pass the binary as a file and have it
// signed for upgrade_public_key; paths are opened only for owners.
func (a *Agent) upgradeInput(req api.UpgradeRequest, by Caller) (*os.File, selfupdate.Check, error) {
	owner := by.Owner
	check := selfupdate.Check{SHA256: req.SHA256, Signature: []byte(req.SignatureText),
		PublicKey: a.settings.UpgradePublicKey, RequireSignature: !owner, ProbeTimeout: probeTimeout}
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

// Upgrade hands every socket and worker to a new agent (upgrade): the
// binary the caller passed (by.File), one at a path for an owner, or the
// agent's own binary again. It returns once the new agent is ready (this
// one then stops) or with the refusal or failure, worded for the user.
func (a *Agent) Upgrade(ctx context.Context, req api.UpgradeRequest, by Caller) (*api.UpgradeResult, error) {
	src, check, err := a.upgradeInput(req, by)
	if src != nil {
		defer src.Close()
	}
	if err == nil {
		var res *api.UpgradeResult
		if res, err = a.upgrade(ctx, src, check, req.RestartWorkers); err == nil {
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

// upgradeAsync runs a handoff on SIGHUP (systemctl reload).
func (a *Agent) upgradeAsync() {
	if _, err := a.upgrade(context.Background(), nil, selfupdate.Check{}, false); err != nil {
		a.log.Error("SIGHUP: upgrade refused or failed; this agent keeps serving", "error", err)
	}
}

// handoffLost decides what a new agent does when it could not tell the
// previous agent it is ready (err). nil: it serves on. An error: it
// exits, leaving every worker running (quiet), for the agent that is
// to serve them:
//   - the previous agent still runs (it gave up the upgrade): that one;
//   - it died (SIGKILL mid-handoff) and systemd supervises the agent: the
//     next one systemd starts (Restart=), which adopts the workers from the
//     record loop wrote once ready. systemd may have seen the previous agent die
//     before it read this one's MAINPID, and then it restarts the service
//     whatever this agent does; an agent serving on would hold the control
//     socket, and each restart would fail until systemd gave up, leaving
//     an agent it does not know (seen in a CI run). Exiting non-zero
//     restarts the service in the other case too;
//   - it died, and nothing would start another: this one.
func (a *Agent) handoffLost(err error) error {
	switch {
	case os.Getppid() == a.parent:
		a.log.Error("the previous agent did not take the handoff; giving up so that it keeps serving", "error", err)
		return fmt.Errorf("upgrade abandoned: %w", err)
	case os.Getenv(handoff.EnvNotifySocket) != "":
		a.log.Error("the previous agent died during the handoff; exiting, the workers left running, "+
			"so that systemd starts the next agent, which adopts them", "error", err)
		notify("STATUS=the previous agent died during the handoff; exiting for systemd to start the next agent")
		a.orphaned = true
		return fmt.Errorf("upgrade interrupted: the previous agent died during the handoff: %w", err)
	default:
		a.log.Warn("the previous agent died during the handoff; this agent serves on", "error", err)
		return nil
	}
}

// envHandoffHold is failpoint.EnvHandoffHold.
const envHandoffHold = failpoint.EnvHandoffHold

// handoffHold reads envHandoffHold: how long to hold, and whether before
// telling systemd.
func handoffHold() (d time.Duration, beforeSystemd bool) {
	v, beforeSystemd := strings.CutPrefix(os.Getenv(envHandoffHold), "before:")
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false
	}
	return min(d, 30*time.Second), beforeSystemd
}

// holdHandoff holds a new agent for envHandoffHold at the point it names:
// before telling systemd its pid (beforeSystemd), or after, before telling
// the previous agent.
func (a *Agent) holdHandoff(beforeSystemd bool) {
	d, before := handoffHold()
	if d <= 0 || !a.upg.HasParent() || before != beforeSystemd {
		return
	}
	what := map[bool]string{true: "systemd", false: "the previous agent"}[before]
	a.log.Warn("holding the handoff before telling "+what+" (a test's failpoint)", "env", envHandoffHold, "for", d)
	time.Sleep(d)
}
