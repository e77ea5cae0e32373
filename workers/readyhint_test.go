package workers

import (
	"strings"
	"testing"

	"github.com/deployd/deployd/workers/nodejs"
)

// A Node.js app that never listened is told so, not to send READY=1 to a
// socket its preload already serves.
func TestReadyHintOfANodeAppNamesListen(t *testing.T) {
	node := &Spec{Node: &nodejs.Spec{}, Ready: ReadyPolicy{Mode: ReadyNotify}}
	got := readyHint(node)
	if !strings.Contains(got, "never called listen()") || strings.Contains(got, "NOTIFY_SOCKET") {
		t.Errorf("node app's hint: %q", got)
	}
	other := &Spec{Ready: ReadyPolicy{Mode: ReadyNotify}}
	if got := readyHint(other); !strings.Contains(got, "READY=1 to $NOTIFY_SOCKET") {
		t.Errorf("a program's hint: %q", got)
	}
}
