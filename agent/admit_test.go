package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// Every app operation goes through admit: an unknown app, an app that
// takes no releases (deploy, rollback) and a busy app are refused with a
// typed error, worded for the user, before anything changed.
func TestAdmitRefusesBeforeAnythingChanges(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, appTOML("web", `["/bin/sleep", "60"]`, "tcp://"+freeTCP(t), `ready = "delay:50ms"`))
	err := runAgent(t, path, newFakeUpgrader(false), func(a *Agent) {
		defer a.Shutdown()
		ctx := context.Background()
		refusal := func(what string, err error, kind api.Kind, words string) {
			t.Helper()
			if err == nil || kindOf(err) != kind || !strings.Contains(err.Error(), words) {
				t.Errorf("%s: %v (kind %s), want kind %s saying %q", what, err, kindOf(err), kind, words)
			}
		}
		_, err := a.Restart(ctx, "nope", discard)
		refusal("restart of an unknown app", err, api.KindNotFound, `unknown app "nope"`)
		_, err = a.Rollback(ctx, api.RollbackRequest{App: "web"}, discard)
		refusal("rollback of an app without releases", err, api.KindUsage, "set releases = true in [apps.web]")
		rt := a.apps.get("web")
		gen := rt.sup.Spec().Generation
		release, err := rt.sup.Claim("another operation") // another operation runs
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []func(context.Context, string, func(workers.Event)) (*api.Result, error){a.Restart, a.Stop, a.Start} {
			_, err = op(ctx, "web", discard)
			refusal("an operation of a busy app", err, api.KindBusy, busyMessage("web"))
		}
		_, err = a.Scale(ctx, api.ScaleRequest{App: "web", Instances: "2"}, discard)
		refusal("scale of a busy app", err, api.KindBusy, busyMessage("web"))
		release()
		if got := rt.sup.Spec().Generation; got != gen {
			t.Errorf("a refused operation changed the app: generation %d, was %d", got, gen)
		}
		res, err := a.Restart(ctx, "web", discard)
		if err != nil || !res.OK {
			t.Errorf("restart once free: %+v, %v", res, err)
		}
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
}
