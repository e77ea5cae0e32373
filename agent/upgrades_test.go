package agent

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/release/selfupdate"
)

// An upgrade runs one at a time, and none before the agent is ready.
func TestUpgradesOneAtATime(t *testing.T) {
	u := &upgrades{log: hclog.NewNullLogger(), upg: newFakeUpgrader(false), ready: make(chan struct{}),
		apps: func() []*appRT { return nil }, hooks: &hooks{log: hclog.NewNullLogger()}}
	u.running.Lock()
	if _, err := u.run(context.Background(), nil, selfupdate.Check{}, false); !errors.Is(err, errUpgradeBusy) {
		t.Errorf("an upgrade while one runs: %v, want %v", err, errUpgradeBusy)
	}
	u.running.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := u.run(ctx, nil, selfupdate.Check{}, false); !errors.Is(err, context.Canceled) {
		t.Errorf("an upgrade before the agent is ready, its caller gone: %v, want the context's error", err)
	}
	if !u.running.TryLock() {
		t.Error("a refused upgrade kept the upgrade lock")
	}
}

// A new agent that the previous one did not take the handoff from gives
// up while its parent lives, exits for systemd's next agent (orphaned)
// when systemd supervises it, and otherwise serves on.
func TestTakeoverLost(t *testing.T) {
	lost := errors.New("ready: broken pipe")
	tk := &takeover{log: hclog.NewNullLogger(), parent: os.Getppid()}
	if err := tk.lost(lost); err == nil || !strings.Contains(err.Error(), "upgrade abandoned") || tk.orphaned {
		t.Errorf("parent alive: %v (orphaned %v), want the upgrade abandoned", err, tk.orphaned)
	}
	tk = &takeover{log: hclog.NewNullLogger(), parent: -1}
	t.Setenv(handoff.EnvNotifySocket, "")
	if err := tk.lost(lost); err != nil || tk.orphaned {
		t.Errorf("parent gone, no systemd: %v (orphaned %v), want to serve on", err, tk.orphaned)
	}
	t.Setenv(handoff.EnvNotifySocket, "/run/systemd/notify")
	if err := tk.lost(lost); !errors.Is(err, lost) || !tk.orphaned {
		t.Errorf("parent gone under systemd: %v (orphaned %v), want to exit orphaned", err, tk.orphaned)
	}
	if r, err := (&takeover{upg: newFakeUpgrader(false)}).receive(); r != nil || err != nil {
		t.Errorf("a first agent received a handover: %+v, %v", r, err)
	}
}
