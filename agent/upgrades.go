package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/release/selfupdate"
)

// errUpgradeBusy is returned when an upgrade is already running.
var errUpgradeBusy = errors.New("an agent upgrade is already running; wait for it to finish")

// upgrades runs this agent's self-upgrades: one at a time (running, a
// TryLock-only operation lock), SIGHUP's in the background (async); each
// checks that no app is held or busy and no after hook runs, then hands
// every app over (handover.go) to a new agent tableflip starts. It sees
// the apps through the func it was given and never calls the agent.
type upgrades struct {
	log     hclog.Logger
	upg     upgrader
	shim    string        // the binary a new agent starts from
	config  string        // the config file, checked before a new agent starts
	timeout time.Duration // [agent] upgrade_timeout
	ready   <-chan struct{}
	apps    func() []*appRT
	hooks   *hooks

	running sync.Mutex     // held while an upgrade runs; TryLock only
	async   sync.WaitGroup // SIGHUP upgrades in flight
}

// run hands every socket to a new agent started from the binary at the
// agent's path, after checking that the config on disk is valid. With src
// (the new binary, as a file the caller opened), its bytes are verified
// (check), written beside the agent's binary, probed and swapped in, and the
// previous binary is restored if anything fails. It returns when the new
// agent is ready (this agent then drains and exits) or has failed (this one
// keeps serving).
//
// The new agent adopts the running workers (handover.go) unless
// restartWorkers: then it starts its own and this one drains its workers.
func (u *upgrades) run(ctx context.Context, src *os.File, check selfupdate.Check, restartWorkers bool) (*api.UpgradeResult, error) {
	if !u.running.TryLock() {
		return nil, errUpgradeBusy
	}
	defer u.running.Unlock()
	// tableflip refuses an upgrade before this agent is ready.
	select {
	case <-u.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := heldApp(u.apps()); err != nil {
		return nil, err
	}
	if err := u.hooks.wait(ctx); err != nil {
		return nil, err
	}
	if err := u.busyApp(restartWorkers); err != nil {
		return nil, err
	}
	res := &api.UpgradeResult{OldVersion: version.String(), OldPID: os.Getpid(), NewVersion: version.String()}
	if err := u.waitParent(ctx); err != nil {
		return nil, err
	}
	if _, err := config.Load(u.config); err != nil {
		return nil, failWith(api.KindRefused, "the config on disk is invalid, so a new agent could not start; fix it first:\n%w", err)
	}
	swapped := false
	if src != nil {
		cand, err := selfupdate.Prepare(src, u.shim, check)
		if err != nil {
			return nil, err
		}
		if err := cand.Commit(); err != nil {
			return nil, err
		}
		res.NewVersion, swapped = cand.Version, true
		u.log.Info("upgrade: new binary in place", "path", u.shim, "version", cand.Version,
			"sha256", fmt.Sprintf("%x", cand.SHA256), "backup", selfupdate.Backup(u.shim))
	}
	u.log.Info("upgrade: starting a new agent", "binary", u.shim)
	t := time.Now()
	h, err := u.handOver(restartWorkers)
	if err != nil {
		// Refused before a new agent started: an operation began meanwhile.
		if swapped {
			if rerr := selfupdate.Restore(u.shim); rerr != nil {
				err = fmt.Errorf("%w; restoring the previous binary FAILED: %v", err, rerr)
			}
		}
		return nil, err
	}
	if err = u.upg.Upgrade(); err != nil {
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
			if rerr := selfupdate.Restore(u.shim); rerr != nil {
				msg += "; restoring the previous binary FAILED: " + rerr.Error()
			} else {
				msg += "; the previous binary is restored"
			}
		}
		u.log.Error("upgrade failed", "error", msg)
		return nil, errors.New(msg)
	}
	res.DurationSeconds = time.Since(t).Seconds()
	u.log.Info("upgrade: new agent ready; this one exits", "new_version", res.NewVersion, "in", time.Since(t).Round(time.Millisecond))
	return res, nil
}

// busyApp refuses an upgrade, before anything changed, while an operation
// runs on an app (a reload, deploy, restart, scale or stop, or a monitor's
// replacement): the next agent takes every app over as it is, and a pool
// mid-operation has no state to hand over. The handover checks again
// (handOver) for an operation that begins meanwhile. With restartWorkers
// the next agent starts every app afresh, and this one stops the running
// operations with their workers.
func (u *upgrades) busyApp(restartWorkers bool) error {
	if restartWorkers {
		return nil
	}
	for _, rt := range u.apps() {
		if rt.sup.Claimed() != nil {
			return failWith(api.KindBusy, "app %s: a reload, deploy, restart, scale or stop of it is running; "+
				"an agent upgrade takes every app over as it is, but not in the middle of an operation: "+
				"wait for it to finish, then upgrade", rt.name)
		}
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
func (u *upgrades) waitParent(ctx context.Context) error {
	if !u.upg.HasParent() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	err := u.upg.WaitForParent(wctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the previous agent is still draining its workers after upgrade_timeout %s; try again later",
			u.timeout)
	}
	if err != nil {
		return fmt.Errorf("wait for the previous agent to exit: %w", err)
	}
	return nil
}

// sighup starts a handoff on SIGHUP (systemctl reload); wait waits for
// those in flight.
func (u *upgrades) sighup() { u.async.Go(u.runAsync) }

func (u *upgrades) wait() { u.async.Wait() }

func (u *upgrades) runAsync() {
	if _, err := u.run(context.Background(), nil, selfupdate.Check{}, false); err != nil {
		u.log.Error("SIGHUP: upgrade refused or failed; this agent keeps serving", "error", err)
	}
}
