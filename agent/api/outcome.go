package api

import "net/http"

// Kind classifies how a request or an operation on one app ended. It is the
// one mapping from errors to outcomes: the agent turns its typed errors into
// a Kind (agent/outcome.go), and this table gives each Kind its HTTP status,
// the CLI's exit code and the per-app Outcome of a streamed result. It is on
// the wire in Error.Kind.
type Kind string

// Kinds of outcome.
const (
	KindDone      Kind = "done"
	KindUsage     Kind = "usage"     // the request itself is wrong (bad value, bad JSON)
	KindNotFound  Kind = "not-found" // unknown app
	KindRefused   Kind = "refused"   // the input was checked and refused; nothing changed
	KindTooLarge  Kind = "too-large" // the body is over MaxRequestBytes
	KindForbidden Kind = "forbidden" // the caller may not do this (see the privilege table)
	KindBusy      Kind = "busy"      // another operation of the app (or an upgrade) runs
	KindAbandoned Kind = "abandoned" // the new version never got ready; the old one serves
	KindFailed    Kind = "failed"    // the operation failed
	// KindStopping: the agent is stopping (a shutdown, or a handoff to a
	// new agent) and did nothing; the client asks once more, and a new
	// agent answers if there is one.
	KindStopping Kind = "stopping"
	// KindLimited: the caller holds as many control connections as it may
	// (agent/control/connlimit.go); the agent refused this one and did nothing.
	KindLimited Kind = "limited"
)

// Exit codes of the CLI (cli uses these).
const (
	ExitOK          = 0
	ExitFailed      = 1 // the operation failed or was refused at run time
	ExitUsage       = 2 // usage, config or input error; nothing changed
	ExitUnreachable = 3 // the agent cannot be reached
)

type outcome struct {
	status int    // HTTP status of an answer that is only this error
	exit   int    // the CLI's exit code
	app    string // AppResult.Outcome
}

var outcomes = map[Kind]outcome{
	KindDone:      {http.StatusOK, ExitOK, OutcomeDone},
	KindUsage:     {http.StatusBadRequest, ExitUsage, OutcomeFailed},
	KindNotFound:  {http.StatusNotFound, ExitUsage, OutcomeFailed},
	KindRefused:   {http.StatusUnprocessableEntity, ExitUsage, OutcomeFailed},
	KindTooLarge:  {http.StatusRequestEntityTooLarge, ExitUsage, OutcomeFailed},
	KindForbidden: {http.StatusForbidden, ExitFailed, OutcomeFailed},
	KindBusy:      {http.StatusConflict, ExitFailed, OutcomeRefused},
	KindAbandoned: {http.StatusInternalServerError, ExitFailed, OutcomeAbandoned},
	KindFailed:    {http.StatusInternalServerError, ExitFailed, OutcomeFailed},
	KindNoCanary:  {http.StatusPreconditionFailed, ExitFailed, OutcomeFailed},
	KindStopping:  {http.StatusServiceUnavailable, ExitUnreachable, OutcomeRefused},
	KindLimited:   {http.StatusServiceUnavailable, ExitFailed, OutcomeRefused},
}

func (k Kind) get() outcome {
	if o, ok := outcomes[k]; ok {
		return o
	}
	return outcomes[KindFailed]
}

// HTTPStatus is the status of an answer that reports k.
func (k Kind) HTTPStatus() int { return k.get().status }

// ExitCode is the CLI's exit code for k.
func (k Kind) ExitCode() int { return k.get().exit }

// Outcome is the AppResult.Outcome for k.
func (k Kind) Outcome() string { return k.get().app }

// KindOfStatus is the Kind of an HTTP status, for answers without Error.Kind.
func KindOfStatus(status int) Kind {
	if status/100 == 2 {
		return KindDone
	}
	for k, o := range outcomes {
		if o.status == status && k != KindAbandoned && k != KindLimited {
			return k
		}
	}
	return KindFailed
}
