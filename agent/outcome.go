package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/release/selfupdate"
	"github.com/deployd/deployd/workers"
)

// reqError is an error whose outcome the operation knows (bad input,
// unknown app, a refusal); msg, when set, is how the user reads it.
type reqError struct {
	kind api.Kind
	err  error
	msg  string
}

func (e *reqError) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return e.err.Error()
}
func (e *reqError) Unwrap() error { return e.err }

// failWith returns an error of kind k.
func failWith(k api.Kind, format string, args ...any) error {
	return &reqError{kind: k, err: fmt.Errorf(format, args...)}
}

// prefixed is err (of the same kind) with what was asked said first:
// "deploy refused, nothing changed: ".
func prefixed(prefix string, err error) error {
	return &reqError{kind: kindOf(err), err: err, msg: prefix + err.Error()}
}

// refused is the refusal of an operation on app that is busy or holds a
// canary (err), worded for the user (refusal).
func refused(app string, err error) error {
	return &reqError{kind: api.KindBusy, err: err, msg: refusal(app, err)}
}

// KindOf is the one mapping of the agent's errors to outcomes; api.Kind
// gives each its HTTP status, exit code and per-app outcome.
func KindOf(err error) api.Kind { return kindOf(err) }

func kindOf(err error) api.Kind {
	var re *reqError
	var ab *workers.AbandonedError
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
	}
	return api.KindFailed
}

// ReasonOf names what was wrong with a refused artifact or binary ("" for
// another error): api.Error.Reason.
func ReasonOf(err error) string {
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

// appResult is the streamed outcome of an operation on app.
func appResult(app string, err error) api.AppResult {
	k := kindOf(err)
	res := api.AppResult{App: app, Outcome: k.Outcome()}
	var ab *workers.AbandonedError
	var nc *workers.NoCanaryError
	var nr *workers.NotReadyError
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
	case errors.As(err, &nr):
		// A start whose new workers never got ready (the first of them):
		// its output is where the cause is, such as a missing module.
		res.Error = err.Error()
		res.LastLines = nr.Worker.LastLines()
		if nr.Exited {
			res.ExitStatus = nr.Worker.ExitDescription()
		}
	default:
		res.Error = err.Error()
	}
	return res
}

func busyMessage(app string) string {
	return fmt.Sprintf("%s: another reload, restart or deploy of this app is running; wait for it to finish, then try again", app)
}
