package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

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
		{&workers.HoldError{App: "web", Release: "v2", Previous: "v1", Slots: []int{0}}, http.StatusConflict, 1, api.OutcomeRefused},
		{&workers.NoCanaryError{App: "web"}, http.StatusPreconditionFailed, 1, api.OutcomeFailed},
		{fmt.Errorf("%w: a canary needs at least 2 workers", workers.ErrBadCanary), http.StatusBadRequest, 2, api.OutcomeFailed},
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

// A refusal during a hold, and a promote without one, say what to run.
func TestCanaryMessages(t *testing.T) {
	since := time.Date(2026, 1, 2, 12, 0, 3, 0, time.Local)
	he := &workers.HoldError{App: "web", Release: "1.5.0", Previous: "1.4.2", Slots: []int{0, 1}, Since: since}
	want := "web holds a canary: release 1.5.0 on workers 0, 1 beside 1.4.2 since 12:00:03; run `deployd promote web` " +
		"to roll 1.5.0 out to every worker, or `deployd abort web` to put workers 0, 1 back on 1.4.2"
	if got := appResult("web", fmt.Errorf("reload: %w", he)).Error; got != want {
		t.Errorf("refusal during a hold:\n got %s\nwant %s", got, want)
	}
	last := &workers.CanaryEnd{Outcome: workers.CanaryAborted, Release: "1.5.0", Previous: "1.4.2", By: "crash",
		Reason: "canary worker 0 (pid 42) crashed: exit status 1", At: since}
	want = "web holds no canary: the last one (release 1.5.0) was aborted at 12:00:03 by crash " +
		"(canary worker 0 (pid 42) crashed: exit status 1); 1.4.2 serves"
	if got := noCanaryMessage(&workers.NoCanaryError{App: "web", Last: last}); got != want {
		t.Errorf("promote after an abort:\n got %s\nwant %s", got, want)
	}
	if got := noCanaryMessage(&workers.NoCanaryError{App: "web"}); !strings.Contains(got, "deployd reload web --canary 1") {
		t.Errorf("promote without any canary: %s", got)
	}
	if got := appResult("web", fmt.Errorf("%w: the app is stopped; start it first", workers.ErrBadCanary)).Error; got !=
		"canary refused, nothing changed: the app is stopped; start it first" {
		t.Errorf("bad canary: %s", got)
	}
}

// While a canary's workers still start there is no hold to end: promote
// and abort say so, naming the slot the hold waits for.
func TestCanaryStartingMessage(t *testing.T) {
	s := workers.AppStatus{Busy: &workers.BusyError{App: "web", Op: canaryOpPrefix + "2.0.0"}, Workers: []workers.WorkerStatus{
		{Slot: 0, State: workers.Ready, Release: "2.0.0"}, {Slot: 1, State: workers.Ready, Release: "1.0.0"},
		{Slot: 1, State: workers.Starting, Release: "2.0.0"}, {Slot: 2, State: workers.Ready, Release: "1.0.0"},
	}}
	msg, ok := canaryStarting("web", s)
	if !ok || !strings.HasPrefix(msg, "web: canary starting (slot 1 not ready yet) of release 2.0.0; wait until it holds") {
		t.Errorf("canaryStarting = %q, %v", msg, ok)
	}
	s.Workers = s.Workers[1:2] // slot 0's new worker not started yet
	if msg, _ := canaryStarting("web", s); !strings.Contains(msg, "(slot 0 not ready yet)") {
		t.Errorf("canaryStarting before slot 0 started = %q", msg)
	}
	for _, busy := range []*workers.BusyError{nil, {App: "web", Op: "reload to release 2.0.0"}} {
		if msg, ok := canaryStarting("web", workers.AppStatus{Busy: busy}); ok {
			t.Errorf("canaryStarting without a canary starting (%v) = %q", busy, msg)
		}
	}
}
