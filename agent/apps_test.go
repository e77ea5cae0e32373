package agent

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// accepts reports whether something listens on addr.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// appOn is an app config listening on addrs.
func appOn(addrs ...string) *config.App {
	app := &config.App{Name: "web"}
	for _, a := range addrs {
		app.Listen = append(app.Listen, config.Listen{URL: "tcp://" + a, Network: "tcp", Address: a, Name: "web"})
	}
	return app
}

// A reload whose rollback failed keeps the new version in some slots: the
// listener only the new spec has must stay open (it serves), until an
// operation settles every worker on one config.
func TestFailedRollbackKeepsNewListenersOpen(t *testing.T) {
	reg := handoff.NewRegistry(nil, nil, nil)
	defer reg.Close()
	shared, added := freeTCP(t), freeTCP(t)
	lease := func(app *config.App) *handoff.Lease {
		l, err := reg.Acquire("web", wants(app, nil))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	old := appOn(shared)
	rt := &appRT{name: "web", cfg: old, lease: lease(old)}

	next := appOn(shared, added)
	partial := &workers.AbandonedError{Reason: errors.New("worker 1 exited"), RolledBack: false}
	rt.settle(next, lease(next), partial)
	if !accepts(added) {
		t.Fatal("a failed rollback closed the listener the new version's workers serve")
	}
	if rt.config() != old {
		t.Error("an abandoned reload changed the running config")
	}

	rolledBack := &workers.AbandonedError{Reason: errors.New("not ready"), RolledBack: true}
	third := appOn(shared, freeTCP(t))
	rt.settle(third, lease(third), rolledBack)
	if addr := third.Listen[1].Address; accepts(addr) {
		t.Errorf("a fully rolled back reload keeps its new listener %s open", addr)
	}

	rt.settle(old, lease(old), nil) // a reload that moves every worker to old
	if accepts(added) {
		t.Error("the stale lease was not released once every worker runs the running config")
	}
	if !accepts(shared) {
		t.Error("the running config's listener closed")
	}
	rt.release()
	if accepts(shared) {
		t.Error("release kept the listener of a removed app open")
	}
}
