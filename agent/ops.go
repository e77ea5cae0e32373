package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// The operations on one running app: scale, stop, start, restart. Each is
// admitted (admit: found, no canary held, not busy) and returns either a
// refusal before anything changed or a result that says how it ended.

// Scale sets how many workers the app runs (req.Instances: "N", "+N",
// "-N", or api.ScaleReset for the config's count).
func (a *Agent) Scale(_ context.Context, req api.ScaleRequest, emit func(workers.Event)) (*api.Result, error) {
	rt, done, _, err := a.admit(req.App, rule{op: "scale"})
	if err != nil {
		return nil, err
	}
	defer done()
	reset := req.Instances == api.ScaleReset
	spec := rt.sup.Spec()
	n, err := parseScale(req.Instances, spec.Instances-spec.Spares) // spares come on top
	if reset {
		n, err = rt.config().Instances, nil
	}
	if err != nil {
		return nil, failWith(api.KindUsage, "%w", err)
	}
	if rt.config().Releases && a.state.get(rt.name).Current == "" {
		return nil, failWith(api.KindRefused, "%s has no release yet; deploy one first", rt.name)
	}
	t := time.Now()
	err = rt.sup.Scale(n, emit)
	if err == nil {
		err = a.state.update(rt.name, func(s *AppState) {
			s.Instances, s.Stopped = n, false
			if reset {
				s.Instances = 0 // the config's count, also after it changes
			}
		})
	}
	if err == nil {
		rt.log.Info("app scaled", "instances", n)
	}
	return opResult(rt, t, err), nil
}

// Stop stops the app's workers until Start; the state file remembers it.
func (a *Agent) Stop(_ context.Context, app string, _ func(workers.Event)) (*api.Result, error) {
	return a.runOp(app, "stop", func(rt *appRT) error {
		err := rt.sup.Pause()
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = true })
		}
		if err == nil {
			rt.log.Info("app stopped")
		}
		return err
	})
}

// Start starts the workers of a stopped app on its running config.
func (a *Agent) Start(_ context.Context, app string, _ func(workers.Event)) (*api.Result, error) {
	return a.runOp(app, "start", func(rt *appRT) error {
		spec, err := a.build.spec(rt.config(), rt.running(), a.state.get(rt.name).Current)
		if err == nil {
			err = rt.sup.Restart(spec)
		}
		if err == nil {
			rt.settled() // every worker runs the running config's listeners
		}
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = false })
		}
		return err
	})
}

// Restart replaces every worker of the app with a new one of the same spec.
func (a *Agent) Restart(_ context.Context, app string, _ func(workers.Event)) (*api.Result, error) {
	return a.runOp(app, "restart", func(rt *appRT) error {
		err := rt.sup.Restart(nil)
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = false })
		}
		return err
	})
}

// runOp admits an operation on app, runs op and returns its result.
func (a *Agent) runOp(app, what string, op func(rt *appRT) error) (*api.Result, error) {
	rt, done, _, err := a.admit(app, rule{op: what})
	if err != nil {
		return nil, err
	}
	defer done()
	t := time.Now()
	return opResult(rt, t, op(rt)), nil
}

// opResult is the result of an operation on rt that began at t.
func opResult(rt *appRT, t time.Time, err error) *api.Result {
	res := appResult(rt.name, err)
	res.Release, res.DurationSeconds = rt.sup.Spec().Release, time.Since(t).Seconds()
	return &api.Result{OK: err == nil, Apps: []api.AppResult{res}}
}

// parseScale resolves "N", "+N" or "-N" against the current count.
func parseScale(s string, current int) (int, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("instances %q: use N, +N or -N, e.g. 4 or +1", s)
	}
	n := v
	if strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") {
		n = current + v
	}
	if n < 1 {
		return 0, fmt.Errorf("instances %q would leave %d workers; at least 1 (use `deployd stop` to stop the app)", s, n)
	}
	if n > 1024 {
		return 0, fmt.Errorf("instances %q: at most 1024 workers", s)
	}
	return n, nil
}
