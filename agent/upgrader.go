package agent

import (
	"context"
	"net"
	"time"

	"github.com/cloudflare/tableflip"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
)

// upgrader is what the agent needs of tableflip: descriptors that cross a
// handoff, and the handoff itself. Behind an interface so that the agent's
// lifecycle gets unit tests without forking (a fake in the tests).
type upgrader interface {
	Fds() fdStore
	// Ready tells the previous agent (if any) that this one serves.
	Ready() error
	// Upgrade starts a new agent and returns once it is ready or failed.
	Upgrade() error
	// Exit is closed once a new agent is ready (this one then drains).
	Exit() <-chan struct{}
	// HasParent reports whether a previous agent started this one.
	HasParent() bool
	// WaitForParent returns once the previous agent has exited.
	WaitForParent(ctx context.Context) error
	// Stop cancels an upgrade in flight and closes (and unlinks) the unix
	// sockets this process created; a new agent that gives up must not.
	Stop()
}

// fdStore keeps descriptors across a handoff (*tableflip.Fds).
type fdStore interface {
	handoff.Store
	Listener(network, addr string) (net.Listener, error)
	Listen(network, addr string) (net.Listener, error)
	AddListener(network, addr string, ln tableflip.Listener) error
}

// flip is the real upgrader.
type flip struct{ u *tableflip.Upgrader }

func newFlip(s config.Agent) (upgrader, error) {
	u, err := tableflip.New(tableflip.Options{UpgradeTimeout: s.UpgradeTimeout, PIDFile: s.PIDFile})
	if err != nil {
		return nil, err
	}
	return flip{u}, nil
}

func (f flip) Fds() fdStore                            { return f.u.Fds }
func (f flip) Ready() error                            { return f.u.Ready() }
func (f flip) Exit() <-chan struct{}                   { return f.u.Exit() }
func (f flip) HasParent() bool                         { return f.u.HasParent() }
func (f flip) WaitForParent(ctx context.Context) error { return f.u.WaitForParent(ctx) }
func (f flip) Stop()                                   { f.u.Stop() }

// errParentRunning is tableflip's refusal while its parent runs.
const errParentRunning = "parent hasn't exited"

func (f flip) Upgrade() error { return upgradeOnceParentGone(f.u, time.Second) }

// handoffStarter is the part of *tableflip.Upgrader that Upgrade uses.
type handoffStarter interface {
	Upgrade() error
	WaitForParent(ctx context.Context) error
}

// upgradeOnceParentGone asks u for a handoff. tableflip learns of its
// parent's exit in its run loop, whose select may take an upgrade request
// first: it then refuses with "parent hasn't exited" although WaitForParent
// has returned (seen with upgrades ~40 ms apart on a loaded machine). That
// refusal comes before any child starts, so once WaitForParent says the
// parent is gone, ask again for up to bound. The loop polls: tableflip
// gives no event for it.
func upgradeOnceParentGone(u handoffStarter, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		err := u.Upgrade()
		if err == nil || err.Error() != errParentRunning || time.Now().After(deadline) || !parentGone(u) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// parentGone tells whether WaitForParent has seen the parent exit.
func parentGone(u handoffStarter) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	return u.WaitForParent(ctx) == nil
}
