package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/release"
)

// probeTimeout bounds `NEW version` before an upgrade.
const probeTimeout = 5 * time.Second

// errUpgradeBusy is returned when an upgrade is already running.
var errUpgradeBusy = errors.New("an agent upgrade is already running; wait for it to finish")

// upgrade hands every socket to a new agent started from the binary at the
// agent's path, after checking that the config on disk is valid. With a
// binary, that file is verified and swapped in first, and the previous
// binary is restored if anything fails. It returns when the new agent is
// ready (this agent then drains and exits) or has failed (this one keeps
// serving).
func (a *Agent) upgrade(ctx context.Context, req api.UpgradeRequest) (*api.UpgradeResult, error) {
	if !a.upgrading.TryLock() {
		return nil, errUpgradeBusy
	}
	defer a.upgrading.Unlock()
	res := &api.UpgradeResult{OldVersion: version.String(), OldPID: os.Getpid(), NewVersion: version.String()}
	// A new agent whose predecessor still drains cannot hand off yet
	// (tableflip#52): wait for it, bounded.
	if a.upg.HasParent() {
		wctx, cancel := context.WithTimeout(ctx, a.settings.UpgradeTimeout)
		err := a.upg.WaitForParent(wctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("the previous agent is still draining its workers after upgrade_timeout %s; try again later",
				a.settings.UpgradeTimeout)
		}
		if err != nil {
			return nil, fmt.Errorf("wait for the previous agent to exit: %w", err)
		}
	}
	if _, err := config.Load(a.path); err != nil {
		return nil, &badRequest{fmt.Errorf("the config on disk is invalid, so a new agent could not start; fix it first:\n%w", err)}
	}
	swapped := false
	if req.Binary != "" {
		b, err := release.CheckBinary(req.Binary, req.SHA256, req.Signature, a.settings.UpgradePublicKey, probeTimeout)
		if err != nil {
			return nil, &badRequest{err}
		}
		res.NewVersion = b.Version
		if err := release.Swap(b, a.shim); err != nil {
			return nil, err
		}
		swapped = true
		a.log.Info("upgrade: new binary in place", "path", a.shim, "version", b.Version, "backup", release.Backup(a.shim))
	}
	a.log.Info("upgrade: starting a new agent", "binary", a.shim)
	t := time.Now()
	if err := a.upg.Upgrade(); err != nil {
		msg := fmt.Sprintf("the new agent did not get ready (%v); this agent (pid %d) keeps serving", err, os.Getpid())
		if swapped {
			if rerr := release.Restore(a.shim); rerr != nil {
				msg += "; restoring the previous binary FAILED: " + rerr.Error()
			} else {
				msg += "; the previous binary is restored"
			}
		}
		a.log.Error("upgrade failed", "error", msg)
		return nil, errors.New(msg)
	}
	res.DurationSeconds = time.Since(t).Seconds()
	a.log.Info("upgrade: new agent ready; draining this one", "new_version", res.NewVersion, "in", time.Since(t).Round(time.Millisecond))
	return res, nil
}

// badRequest marks an error as the caller's (HTTP 422; the CLI exits 1, as
// for every refused upgrade).
type badRequest struct{ err error }

func (e *badRequest) Error() string { return e.err.Error() }
func (e *badRequest) Unwrap() error { return e.err }

func (a *Agent) handleUpgrade(w http.ResponseWriter, r *http.Request) {
	var req api.UpgradeRequest
	if !decode(w, r, &req) {
		return
	}
	res, err := a.upgrade(r.Context(), req)
	var br *badRequest
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, errUpgradeBusy):
		writeError(w, http.StatusConflict, err.Error())
	case errors.As(err, &br):
		writeError(w, http.StatusUnprocessableEntity, "upgrade refused, nothing changed: "+err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "upgrade failed: "+err.Error())
	}
}

// upgradeAsync runs a handoff on SIGHUP (systemctl reload).
func (a *Agent) upgradeAsync() {
	if _, err := a.upgrade(context.Background(), api.UpgradeRequest{}); err != nil {
		a.log.Error("SIGHUP: upgrade refused or failed; this agent keeps serving", "error", err)
	}
}
