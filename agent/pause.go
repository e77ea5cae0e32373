package agent

import (
	"context"
	"errors"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// maxPause bounds a pause's maximum: connections that wait longer than a
// client's own timeouts are lost anyway.
const maxPause = 24 * time.Hour

// Pause makes the new connections of an app whose connections the kernel
// steers (balance "even" or "sticky") wait in the kernel's queue until
// Resume, or for req.MaxSeconds at most; the workers go on with the
// connections they have. It runs beside a reload or a canary hold (a
// migration, a deploy's cutover), and pausing a paused app sets its new
// maximum.
func (a *Agent) Pause(_ context.Context, req api.PauseRequest, _ func(workers.Event)) (*api.Result, error) {
	if req.MaxSeconds < 0 || req.MaxSeconds > maxPause.Seconds() {
		return nil, failWith(api.KindUsage, "--max %gs: give a duration from 1ms to %s, or none to pause until deployd resume", req.MaxSeconds, maxPause)
	}
	rt, done, _, err := a.admit(req.App, rule{op: "pause", endsHold: true, lockIfFree: true})
	if err != nil {
		return nil, err
	}
	defer done()
	max := time.Duration(req.MaxSeconds * float64(time.Second))
	if err := rt.sup.PauseConnections(max); err != nil {
		if errors.Is(err, workers.ErrPauseNeedsSteering) {
			return nil, failWith(api.KindRefused, "%s: pause needs kernel steering, and its connections are shared "+
				"(balance %q in effect); set balance = \"even\" in [apps.%s] and reload; nothing was changed",
				rt.name, rt.sup.Status().Balance, rt.name)
		}
		return nil, failWith(api.KindFailed, "pause %s: %w", rt.name, err)
	}
	rt.log.Info("new connections paused", "max", max)
	return &api.Result{OK: true, Apps: []api.AppResult{appResult(rt.name, nil)}}, nil
}

// Resume ends an app's connection pause: the connections that waited are
// served first, in order, then new ones. An app that is not paused is left
// as it is.
func (a *Agent) Resume(_ context.Context, app string, _ func(workers.Event)) (*api.Result, error) {
	rt, done, _, err := a.admit(app, rule{op: "resume", endsHold: true, lockIfFree: true})
	if err != nil {
		return nil, err
	}
	defer done()
	rt.sup.ResumeConnections()
	rt.log.Info("new connections resumed")
	return &api.Result{OK: true, Apps: []api.AppResult{appResult(rt.name, nil)}}, nil
}

// apiPause is a connection pause as status shows it.
func apiPause(p *workers.PauseStatus) *api.Pause {
	if p == nil {
		return nil
	}
	out := &api.Pause{SinceSeconds: time.Since(p.Since).Seconds(), Queued: p.Queued, Backlog: p.Backlog}
	if !p.Until.IsZero() {
		in := max(time.Until(p.Until).Seconds(), 0)
		out.EndsInSeconds = &in
	}
	return out
}
