package control

import (
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// The operation log says "done" for the outcomes an operation asked for.
func TestSucceeded(t *testing.T) {
	for outcome, want := range map[string]bool{api.OutcomeDone: true, api.OutcomeHeld: true, api.OutcomePromoted: true,
		api.OutcomeAborted: true, api.OutcomeAbandoned: false, api.OutcomeFailed: false, api.OutcomeRefused: false} {
		if succeeded(outcome) != want {
			t.Errorf("succeeded(%q) = %v, want %v", outcome, !want, want)
		}
	}
}
