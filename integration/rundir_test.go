package integration

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// The control socket's folder, created by the first agent, is removed at
// shutdown by the agent an upgrade started: `deployd upgrade` then
// `deployd shutdown` leaves no empty /run/deployd behind.
func TestShutdownAfterUpgradeRemovesCreatedRunDir(t *testing.T) {
	parallel(t)
	a := NewAgentDir(t, bins, agentOnlyConfig)
	run := filepath.Join(a.Dir, "run")
	a.Socket = filepath.Join(run, "deployd", "deployd.sock")
	a.Client = api.NewClient(a.Socket)
	a.WriteConfig(agentOnlyConfig)
	a.Start()
	ctx, cancel := a.Ctx(0)
	v, err := a.Client.Version(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if r := a.CLI("upgrade"); r.Code != 0 {
		t.Fatalf("upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	ctx, cancel = a.Ctx(0)
	v2, err := a.Client.Version(ctx)
	cancel()
	if err != nil || v2.PID == v.PID {
		t.Fatalf("after the upgrade: version %+v, %v; want a new agent pid (was %d)", v2, err, v.PID)
	}
	if r := a.CLI("shutdown"); r.Code != 0 {
		t.Fatalf("shutdown: exit %d\n%s", r.Code, r.Stderr)
	}
	for t0 := time.Now(); Alive(v2.PID) && time.Since(t0) < 30*time.Second; {
		time.Sleep(20 * time.Millisecond)
	}
	if Alive(v2.PID) {
		t.Fatalf("agent %d still runs 30s after shutdown", v2.PID)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		entries, _ := os.ReadDir(filepath.Join(run, "deployd"))
		t.Errorf("the control socket's folder %s, created by the first agent, is still there after upgrade and shutdown (%v, holds %v)\n%s",
			run, err, entries, a.Log())
	}
}
