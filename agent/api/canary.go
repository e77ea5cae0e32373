package api

import (
	"context"
	"time"
)

// Paths of the canary API (POST, streamed; body AppRequest).
const (
	PathPromote = "/v1/promote" // roll the rest of a held canary
	PathAbort   = "/v1/abort"   // put a held canary back on the previous release
)

// Canary outcomes: AppResult.Outcome of a reload --canary that holds, of
// promote and of abort; DeployResult.Status of a deploy --canary that holds.
const (
	OutcomeHeld     = "held"     // the canary serves beside the old release; promote or abort it
	OutcomePromoted = "promoted" // every worker runs the canary's release
	OutcomeAborted  = "aborted"  // the canaries are back on the previous release
	DeployHeld      = "held"
)

// KindNoCanary answers promote or abort for an app that holds no canary
// (its message says how the last one ended).
const KindNoCanary Kind = "no-canary"

// Canary is a held canary (App.Canary, and the result that starts it).
type Canary struct {
	Release  string `json:"release"`  // of the canaries
	Previous string `json:"previous"` // of the other workers
	// Slots are the workers that run Release; the others run Previous.
	Slots          []int     `json:"slots"`
	Since          time.Time `json:"since"`
	HeldSeconds    float64   `json:"held_seconds"`
	TimeoutSeconds float64   `json:"timeout_seconds,omitempty"` // canary_timeout, 0 = none
	// Action is what canary_timeout does: "abort" or "promote".
	Action string `json:"action,omitempty"`
	// Ending says what ends the hold now ("abort: canary worker 0 ... crashed").
	Ending string `json:"ending,omitempty"`
}

// CanaryEnd says how a hold ended (App.LastCanary, AppResult.CanaryEnd).
type CanaryEnd struct {
	// Outcome is "promoted", "aborted" or "failed" (the promote was
	// abandoned: a new worker was not ready; every worker went back).
	Outcome  string `json:"outcome"`
	Release  string `json:"release"`
	Previous string `json:"previous"`
	// By is what ended it: "promote", "abort", "canary_timeout", "crash",
	// or a monitor ("max_memory", "watchdog", "liveness").
	By          string    `json:"by"`
	Reason      string    `json:"reason,omitempty"`
	At          time.Time `json:"at"`
	HeldSeconds float64   `json:"held_seconds"`
	Error       string    `json:"error,omitempty"`
	// Already: the hold had ended this way before the promote or abort
	// that answers this (e.g. by canary_timeout); nothing was done.
	Already bool `json:"already,omitempty"`
}

// Promote rolls the rest of app's held canary to its release.
func (c *Client) Promote(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathPromote, AppRequest{App: app}, onEvent)
}

// Abort puts app's held canary back on the previous release.
func (c *Client) Abort(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathAbort, AppRequest{App: app}, onEvent)
}
