package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
)

// hooks plans a hook in its release's folder, runs it there with its
// output in the result, counts an after hook while it runs, and starts
// none once closed.
func TestHooksPlanRunAndClose(t *testing.T) {
	store := &release.Store{Dir: t.TempDir()}
	k := &hooks{log: hclog.NewNullLogger(), releases: store}
	app := &config.App{Name: "web", Hooks: config.Hooks{
		Before: []string{"/bin/sh", "-c", "pwd; exit 3"}, BeforeTimeout: 10 * time.Second,
	}}
	if h := k.plan(app, "after", "deploy", "v2", "v1"); h != nil {
		t.Errorf("an app without an after hook: planned %+v", h)
	}
	h := k.plan(app, "before", "deploy", "v2", "v1")
	if h == nil || h.dir != store.Path("web", "v2") || !slices.Equal(h.argv, app.Hooks.Before) {
		t.Fatalf("before hook planned as %+v", h)
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rt := &appRT{name: "web", log: hclog.NewNullLogger()}
	var events []workers.Event
	res := k.run(rt, app, h, func(e workers.Event) { events = append(events, e) })
	dir, _ := filepath.EvalSymlinks(h.dir)
	if res.OK || res.ExitStatus != "exit status 3" || !slices.Contains(res.LastLines, "hook before: "+dir) || len(events) != 2 {
		t.Errorf("before hook that prints its folder and exits 3: %+v, events %d", res, len(events))
	}
	k.close()
	after := &hookRun{name: "after", argv: []string{"/bin/true"}, timeout: time.Second, dir: h.dir}
	if res := k.run(rt, app, after, discard); res.OK || res.ExitStatus != "not started" {
		t.Errorf("an after hook once closed: %+v, want not started", res)
	}
}
