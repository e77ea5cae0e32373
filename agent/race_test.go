package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

// TestListenerNamesAreNotSharedState acquires an app's listeners again (as
// every reload does) while the supervisor crash-restarts its worker, which
// reads the listeners' names to build LISTEN_FDNAMES. Under -race it fails
// if acquiring writes to a Listener a running spec passes on.
func TestListenerNamesAreNotSharedState(t *testing.T) {
	shim, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reg := handoff.NewRegistry(nil, nil, nil)
	defer reg.Close()
	app := &config.App{Name: "web", Listen: []config.Listen{{URL: "tcp://127.0.0.1:0#web", Network: "tcp", Address: "127.0.0.1:0", Name: "web"}}}
	lease, err := reg.Acquire("web", wants(app, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	dir := t.TempDir()
	out, err := logs.OpenSink(logs.Options{Path: filepath.Join(dir, "out.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	sup := workers.New(workers.Options{App: "web", Shim: shim, Out: out, Err: out, Logger: hclog.NewNullLogger()}, &workers.Spec{
		Release: "v1", Generation: 1, Argv: []string{"/bin/false"}, Listeners: lease.Bound(), Instances: 1,
		Ready:        workers.ReadyPolicy{Mode: workers.ReadyDelay, Delay: time.Hour},
		ReadyTimeout: time.Second, StopSignal: syscall.SIGTERM, StopTimeout: time.Second,
		Restart: workers.RestartPolicy{Backoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxRestarts: 1000,
			Window: time.Minute, StableAfter: time.Minute},
	})
	defer sup.Stop()
	go func() { _ = sup.Start() }()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		next, err := reg.Acquire("web", wants(app, nil))
		if err != nil {
			t.Fatal(err)
		}
		next.Release()
		time.Sleep(time.Millisecond)
	}
	if ws := sup.Status().Workers; len(ws) == 0 || ws[0].Restarts < 2 {
		t.Fatalf("the worker must have been restarted while the listeners were acquired: %+v", ws)
	}
}
