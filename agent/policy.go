package agent

import (
	"errors"
	"fmt"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
)

// This file is the one place where the agent translates its config and the
// workers package's types into each other: workers does not import config,
// and the wire format lives in agent/api.

// readyPolicy is the workers readiness policy of a `ready = "..."` value.
func readyPolicy(r config.Ready) workers.ReadyPolicy {
	mode := map[config.ReadyMode]workers.ReadyMode{
		config.ReadyNotify:  workers.ReadyNotify,
		config.ReadyNodeIPC: workers.ReadyNodeIPC,
		config.ReadyLog:     workers.ReadyLog,
		config.ReadyDelay:   workers.ReadyDelay,
		config.ReadyHTTP:    workers.ReadyHTTP,
		config.ReadyBind:    workers.ReadyBind,
	}[r.Mode]
	return workers.ReadyPolicy{Mode: mode, Regex: r.Regex, Delay: r.Delay, Path: r.Path}
}

// healthPolicy is the workers liveness check of an app's [health] table,
// nil when it has none.
func healthPolicy(h *config.Health) *workers.HealthPolicy {
	if h == nil {
		return nil
	}
	return &workers.HealthPolicy{Path: h.Path, Interval: h.Interval, Timeout: h.Timeout, Failures: h.Failures}
}

// restartPolicy is the workers crash-restart policy of an app's config.
func restartPolicy(r config.Restart) workers.RestartPolicy {
	return workers.RestartPolicy{
		Backoff: r.Backoff, MaxBackoff: r.MaxBackoff, MaxRestarts: r.MaxRestarts,
		Window: r.Window, StableAfter: r.StableAfter,
	}
}

// refusal words a supervisor's busy refusal of an operation on app: what
// runs, when a *workers.BusyError says.
func refusal(app string, err error) string {
	var be *workers.BusyError
	var he *workers.HoldError
	if errors.As(err, &he) {
		return holdMessage(app, he)
	}
	if !errors.As(err, &be) {
		return busyMessage(app)
	}
	msg := fmt.Sprintf("%s: %s is running (since %s", app, be.Op, be.Since.Format("15:04:05"))
	if be.By != "" {
		msg += ", started by " + be.By
	}
	return msg + "); wait for it to finish, then try again"
}
