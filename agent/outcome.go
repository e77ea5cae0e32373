package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/release/selfupdate"
	"github.com/deployd/deployd/workers"
)

// reqError is an error whose outcome the handler knows (bad input, unknown
// app, a refusal).
type reqError struct {
	kind api.Kind
	err  error
}

func (e *reqError) Error() string { return e.err.Error() }
func (e *reqError) Unwrap() error { return e.err }

// failWith returns an error of kind k.
func failWith(k api.Kind, format string, args ...any) error {
	return &reqError{kind: k, err: fmt.Errorf(format, args...)}
}

// kindOf is the one mapping of the agent's errors to outcomes; api.Kind
// gives each its HTTP status, exit code and per-app outcome.
func kindOf(err error) api.Kind {
	var re *reqError
	var ab *workers.AbandonedError
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return api.KindDone
	case errors.As(err, &re):
		return re.kind
	case errors.Is(err, workers.ErrBusy), errors.Is(err, errUpgradeBusy):
		return api.KindBusy
	case errors.Is(err, workers.ErrNoCanary):
		return api.KindNoCanary
	case errors.Is(err, workers.ErrBadCanary):
		return api.KindUsage
	case errors.As(err, &ab):
		return api.KindAbandoned
	case errors.Is(err, release.ErrBadArtifact), errors.Is(err, selfupdate.ErrBadBinary):
		return api.KindRefused
	case errors.As(err, &mbe):
		return api.KindTooLarge
	}
	return api.KindFailed
}

// writeErr answers err with its status and kind; prefix says what was
// asked ("deploy refused, nothing changed: ").
func writeErr(w http.ResponseWriter, prefix string, err error) {
	k := kindOf(err)
	writeJSON(w, k.HTTPStatus(), api.Error{Error: prefix + err.Error(), Kind: k, Reason: reasonOf(err)})
}

// reasonOf names what was wrong with a refused artifact or binary.
func reasonOf(err error) string {
	var ar *release.RefusedError
	var br *selfupdate.RefusedError
	switch {
	case errors.As(err, &ar):
		return string(ar.Problem)
	case errors.As(err, &br):
		return string(br.Problem)
	}
	return ""
}

// writeError answers msg with status code.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, api.Error{Error: msg, Kind: api.KindOfStatus(code)})
}

// appResult is the streamed outcome of an operation on app.
func appResult(app string, err error) api.AppResult {
	k := kindOf(err)
	res := api.AppResult{App: app, Outcome: k.Outcome()}
	var ab *workers.AbandonedError
	var nc *workers.NoCanaryError
	switch {
	case err == nil:
	case k == api.KindBusy:
		res.Error = refusal(app, err)
	case errors.As(err, &nc):
		res.Error = noCanaryMessage(nc)
	case errors.Is(err, workers.ErrBadCanary):
		res.Error = "canary refused, nothing changed: " + strings.TrimPrefix(err.Error(), workers.ErrBadCanary.Error()+": ")
	case errors.As(err, &ab):
		res.Error = ab.Reason.Error() + "; " + ab.Serving()
		res.ExitStatus, res.LastLines = ab.ExitStatus, ab.LastLines
	default:
		res.Error = err.Error()
	}
	return res
}

// succeeded reports whether an app's outcome is what its operation asked
// for: done, a canary held, a canary promoted or aborted (a promote or an
// abort that ended a hold). The operation log words it.
func succeeded(outcome string) bool {
	switch outcome {
	case api.OutcomeDone, api.OutcomeHeld, api.OutcomePromoted, api.OutcomeAborted:
		return true
	}
	return false
}

func busyMessage(app string) string {
	return fmt.Sprintf("%s: another reload, restart or deploy of this app is running; wait for it to finish, then try again", app)
}

// apiEvent is the wire form of a workers event.
func apiEvent(e workers.Event) api.Event {
	return api.Event{Time: e.Time, App: e.App, Type: api.EventType(e.Type), Slot: e.Slot, PID: e.PID,
		Release: e.Release, Millis: e.Millis, Message: e.Message}
}
