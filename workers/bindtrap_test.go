package workers

import "testing"

// An app that took the default ready (notify) before the agent answered
// binds gets ready = "bind" and the trap after an upgrade: its workers
// are the same, and adopted.
func TestIdentityKeepsWorkersAcrossTheTrap(t *testing.T) {
	before := &Spec{Release: "v1", Argv: []string{"/srv/web"}, Ready: ReadyPolicy{Mode: ReadyNotify}}
	after := &Spec{Release: "v1", Argv: []string{"/srv/web"}, Ready: ReadyPolicy{Mode: ReadyBind}, BindTrap: true}
	if before.Identity() != after.Identity() {
		t.Errorf("identity changed with the bind trap: %s, then %s", before.Identity(), after.Identity())
	}
	other := &Spec{Release: "v1", Argv: []string{"/srv/web"}, Ready: ReadyPolicy{Mode: ReadyLog}}
	if other.Identity() == after.Identity() {
		t.Errorf("another ready mode has the same identity")
	}
}
