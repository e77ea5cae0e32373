package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// A canary (reload --canary N, deploy --canary N) is a reload the app's
// supervisor holds after N workers (workers/canary.go). The agent records
// its outcome only when the hold ends, however it ends (promote, abort,
// canary_timeout, a canary's crash or monitor breach): the OnEnd of the
// workers.Canary does, before the app admits its next operation. A hold is
// not carried across an agent upgrade (refused while one is held) nor a
// restart of the agent (which starts the app from state.json and the
// config on disk).

// canaryOf is the workers canary of n workers with app's canary_timeout.
func canaryOf(app *config.App, n int, onEnd func(workers.CanaryEnd)) workers.Canary {
	return workers.Canary{N: n, Timeout: app.CanaryTimeout, Action: workers.CanaryAction(app.CanaryAction), OnEnd: onEnd}
}

// holdErr is the reload outcome of a hold's end, for appRT.settle.
func holdErr(e workers.CanaryEnd) error {
	switch {
	case e.Outcome == workers.CanaryPromoted:
		return nil
	case e.Err != nil:
		return e.Err
	}
	return &workers.AbandonedError{Reason: errors.New("canary " + string(e.Outcome)), RolledBack: true}
}

// target is where a reload moves an app: its new config, the spec built
// from it and the lease of that spec's listeners.
type target struct {
	app   *config.App
	spec  *workers.Spec
	lease *handoff.Lease
}

// reloadCanary holds a canary of n workers of a config reload of rt to t:
// t's lease stays with rt (as a stale one, released with the app) until the
// hold ends and settles it.
func reloadCanary(rt *appRT, t target, strategy workers.Strategy, n int, emit func(workers.Event)) api.AppResult {
	c := canaryOf(t.app, n, func(e workers.CanaryEnd) {
		rt.unhold(t.lease)
		rt.settle(t.app, t.lease, holdErr(e))
		logCanaryEnd(rt, e)
	})
	rt.hold(t.lease)
	err := rt.sup.ReloadCanary(t.spec, strategy, c, emit)
	if err != nil {
		rt.unhold(t.lease)
		rt.settle(t.app, t.lease, err)
		res := appResult(rt.name, err)
		res.Release = t.spec.Release
		return res
	}
	res := api.AppResult{App: rt.name, Outcome: api.OutcomeHeld, Release: t.spec.Release,
		Canary: apiCanary(rt.sup.Status().Canary)}
	rt.log.Info("canary held", "release", t.spec.Release, "workers", n)
	return res
}

// deployCanary holds a canary of r.canary workers of a deploy (or
// rollback) of rt to spec (release res.Version); its end records the
// release as rollTo does.
func (a *Agent) deployCanary(rt *appRT, spec *workers.Spec, r roll, emit func(workers.Event), res *api.DeployResult) error {
	version, prev := res.Version, res.Previous
	c := canaryOf(rt.config(), r.canary, func(e workers.CanaryEnd) {
		if e.Outcome == workers.CanaryPromoted {
			rollServing(a.state, a.releases, rt, version, prev, &api.DeployResult{})
			// The after hook runs once the release serves everywhere, in
			// the promote's result when a promote asked (endCanary), and
			// in the agent's and the app's logs.
			if h := a.hooks.plan(rt.config(), "after", "deploy", version, prev); h != nil {
				a.hooks.queueAfter(rt, h)
			}
		} else {
			rollFailed(a.state, rt, version, holdErr(e), &api.DeployResult{})
		}
		logCanaryEnd(rt, e)
	})
	if err := rt.sup.ReloadCanary(spec, r.strategy, c, emit); err != nil {
		return err
	}
	res.Status, res.Canary = api.DeployHeld, apiCanary(rt.sup.Status().Canary)
	rt.log.Info("canary held", "release", version, "previous", prev, "workers", r.canary)
	return nil
}

func logCanaryEnd(rt *appRT, e workers.CanaryEnd) {
	kv := []any{"outcome", e.Outcome, "by", e.By, "release", e.Release, "previous", e.Previous,
		"held", e.Held.Round(time.Millisecond)}
	if e.Reason != "" {
		kv = append(kv, "reason", e.Reason)
	}
	if e.Err != nil {
		rt.log.Error("canary ended; not every worker is back", append(kv, "error", e.Err)...)
		return
	}
	rt.log.Info("canary ended", kv...)
}

// Promote rolls the app's held canary out to every worker.
func (a *Agent) Promote(ctx context.Context, app string, emit func(workers.Event)) (*api.Result, error) {
	return a.endCanary(ctx, app, workers.CanaryPromoted, emit)
}

// Abort puts the app's held canary back on the previous release or config.
func (a *Agent) Abort(ctx context.Context, app string, emit func(workers.Event)) (*api.Result, error) {
	return a.endCanary(ctx, app, workers.CanaryAborted, emit)
}

// endCanary promotes or aborts (want) the app's held canary. Without a
// hold it refuses with KindNoCanary, unless the last hold ended the way
// asked (then it says so, ok).
func (a *Agent) endCanary(_ context.Context, name string, want workers.CanaryOutcome, emit func(workers.Event)) (*api.Result, error) {
	var s workers.AppStatus
	check := func(rt *appRT) error {
		s = rt.sup.Status()
		if s.Canary != nil || (s.LastCanary != nil && s.LastCanary.Outcome == want) {
			return nil
		}
		if msg, starting := canaryStarting(rt.name, s); starting {
			return failWith(api.KindBusy, "%s", msg)
		}
		return failWith(api.KindNoCanary, "%s", noCanaryMessage(&workers.NoCanaryError{App: rt.name, Last: s.LastCanary}))
	}
	// A hold that ended already needs no claim to be told: the app may be
	// claimed by the after hook of a hold that canary_timeout promoted.
	verb := "abort"
	if want == workers.CanaryPromoted {
		verb = "promote"
	}
	rt, done, locked, err := a.admit(name, rule{op: verb, endsHold: true, check: check, lockIfFree: true})
	if err != nil {
		return nil, err
	}
	defer done()
	if !locked && s.Canary != nil {
		return nil, refused(rt.name, workers.ErrBusy)
	}
	t := time.Now()
	var end workers.CanaryEnd
	switch {
	case s.Canary == nil: // ended that way already
		end = *s.LastCanary
	case want == workers.CanaryPromoted:
		end, err = rt.sup.Promote(emit)
	default:
		end, err = rt.sup.Abort(emit)
	}
	res := canaryResult(rt.name, end, err)
	if res.Outcome == api.OutcomePromoted && locked {
		res.Hooks = a.hooks.runQueued(rt, emit) // a deployed canary's after hook
	}
	res.DurationSeconds = time.Since(t).Seconds()
	if s.Canary == nil && res.CanaryEnd != nil {
		res.CanaryEnd.Already = true
	}
	return &api.Result{OK: err == nil && end.Outcome == want && end.Err == nil, Apps: []api.AppResult{res}}, nil
}

// canaryResult is the outcome of a promote or abort that ended as end (or
// was refused with err).
func canaryResult(app string, end workers.CanaryEnd, err error) api.AppResult {
	if err != nil {
		return appResult(app, err)
	}
	res := api.AppResult{App: app, Release: end.Release, CanaryEnd: apiCanaryEnd(&end)}
	var ab *workers.AbandonedError
	switch {
	case end.Outcome == workers.CanaryPromoted:
		res.Outcome = api.OutcomePromoted
	case end.Outcome == workers.CanaryAborted && end.Err == nil:
		res.Outcome, res.Release = api.OutcomeAborted, end.Previous
	case errors.As(end.Err, &ab):
		res = appResult(app, ab)
		res.Release, res.CanaryEnd = end.Previous, apiCanaryEnd(&end)
	default:
		res.Outcome, res.Error = api.OutcomeFailed, fmt.Sprint(end.Err)
	}
	return res
}

// holdMessage words the refusal of an operation on app while he's canary
// is held: what runs where, and the two commands that end the hold.
func holdMessage(app string, he *workers.HoldError) string {
	return fmt.Sprintf("%s holds a canary: release %s on %s beside %s since %s; "+
		"run `deployd promote %s` to roll %s out to every worker, or `deployd abort %s` to put %s back on %s",
		app, he.Release, slotList(he.Slots), he.Previous, he.Since.Format(time.TimeOnly),
		app, he.Release, app, slotList(he.Slots), he.Previous)
}

// canaryOpPrefix starts the name of the operation that starts a canary's
// workers (workers.Supervisor.ReloadCanary), in AppStatus.Busy.
const canaryOpPrefix = "canary of release "

// canaryStarting words a promote or abort of app while its canary still
// starts (a reload or deploy --canary whose workers are not ready yet):
// there is no hold to end yet. False when no canary starts.
func canaryStarting(app string, s workers.AppStatus) (string, bool) {
	if s.Busy == nil || !strings.HasPrefix(s.Busy.Op, canaryOpPrefix) {
		return "", false
	}
	release := strings.TrimPrefix(s.Busy.Op, canaryOpPrefix)
	ready := map[int]bool{}
	slots := map[int]bool{}
	for _, w := range s.Workers {
		slots[w.Slot] = true
		if w.Release == release && w.State == workers.Ready {
			ready[w.Slot] = true
		}
	}
	// The canaries are the first slots, started in order: the first one
	// not ready on the new release is the one the hold waits for.
	slot := 0
	for ready[slot] && slots[slot] {
		slot++
	}
	return fmt.Sprintf("%s: canary starting (slot %d not ready yet) of release %s; wait until it holds "+
		"(`deployd status %s`), then run `deployd promote %s` or `deployd abort %s`", app, slot, release, app, app, app), true
}

// noCanaryMessage words a promote or abort of app without a hold.
func noCanaryMessage(nc *workers.NoCanaryError) string {
	msg := nc.App + " holds no canary"
	l := nc.Last
	if l == nil {
		return msg + "; start one with `deployd reload " + nc.App + " --canary 1` or `deployd deploy " + nc.App + " --canary 1 ...`"
	}
	msg += fmt.Sprintf(": the last one (release %s) was %s at %s by %s", l.Release, l.Outcome, l.At.Format(time.TimeOnly), l.By)
	if l.Reason != "" {
		msg += " (" + l.Reason + ")"
	}
	if l.Outcome == workers.CanaryPromoted {
		return msg + "; " + l.Release + " serves"
	}
	return msg + "; " + l.Previous + " serves"
}

// slotList words slots: "worker 0", "workers 0, 1".
func slotList(slots []int) string {
	parts := make([]string, len(slots))
	for i, s := range slots {
		parts[i] = fmt.Sprint(s)
	}
	if len(slots) == 1 {
		return "worker " + parts[0]
	}
	return "workers " + strings.Join(parts, ", ")
}

// heldApp returns the refusal of an agent upgrade while an app holds a
// canary (a hold is not carried to the next agent), nil when none does.
func heldApp(apps []*appRT) error {
	for _, rt := range apps {
		if he := rt.sup.Holding(); he != nil {
			return failWith(api.KindBusy, "%s. An agent upgrade does not carry a canary's hold: end it first", holdMessage(rt.name, he))
		}
	}
	return nil
}

func apiCanary(cs *workers.CanaryStatus) *api.Canary {
	if cs == nil {
		return nil
	}
	return &api.Canary{Release: cs.Release, Previous: cs.Previous, Slots: cs.Slots, Since: cs.Since,
		HeldSeconds: time.Since(cs.Since).Seconds(), TimeoutSeconds: cs.Timeout.Seconds(),
		Action: string(cs.Action), Ending: cs.Ending}
}

func apiCanaryEnd(e *workers.CanaryEnd) *api.CanaryEnd {
	if e == nil {
		return nil
	}
	out := &api.CanaryEnd{Outcome: string(e.Outcome), Release: e.Release, Previous: e.Previous, By: e.By,
		Reason: e.Reason, At: e.At, HeldSeconds: e.Held.Seconds()}
	if e.Err != nil {
		out.Error = e.Err.Error()
	}
	return out
}
