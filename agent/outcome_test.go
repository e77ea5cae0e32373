package agent

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/release/selfupdate"
	"github.com/deployd/deployd/workers"
)

// Each typed error maps to one outcome: HTTP status, exit code, per-app
// outcome, however deeply it is wrapped.
func TestErrorOutcomes(t *testing.T) {
	for _, tc := range []struct {
		err     error
		status  int
		exit    int
		outcome string
	}{
		{nil, http.StatusOK, 0, api.OutcomeDone},
		{fmt.Errorf("web: %w", workers.ErrBusy), http.StatusConflict, 1, api.OutcomeRefused},
		{errUpgradeBusy, http.StatusConflict, 1, api.OutcomeRefused},
		{fmt.Errorf("x: %w", &workers.AbandonedError{Reason: errors.New("never ready")}), http.StatusInternalServerError, 1, api.OutcomeAbandoned},
		{fmt.Errorf("x: %w", &release.RefusedError{Problem: release.ChecksumMismatch}), http.StatusUnprocessableEntity, 2, api.OutcomeFailed},
		{&selfupdate.RefusedError{Problem: selfupdate.BadSignature}, http.StatusUnprocessableEntity, 2, api.OutcomeFailed},
		{failWith(api.KindForbidden, "no"), http.StatusForbidden, 1, api.OutcomeFailed},
		{failWith(api.KindNotFound, "no"), http.StatusNotFound, 2, api.OutcomeFailed},
		{errors.New("disk full"), http.StatusInternalServerError, 1, api.OutcomeFailed},
	} {
		k := kindOf(tc.err)
		if k.HTTPStatus() != tc.status || k.ExitCode() != tc.exit || k.Outcome() != tc.outcome {
			t.Errorf("%v: kind %s: %d/%d/%s, want %d/%d/%s", tc.err, k, k.HTTPStatus(), k.ExitCode(), k.Outcome(), tc.status, tc.exit, tc.outcome)
		}
		if k != api.KindAbandoned && api.KindOfStatus(k.HTTPStatus()) != k {
			t.Errorf("kind %s does not come back from its status %d", k, k.HTTPStatus())
		}
	}
	if r := appResult("web", workers.ErrBusy); r.Error != busyMessage("web") {
		t.Errorf("busy result says %q", r.Error)
	}
}
