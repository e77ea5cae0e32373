package agent

import (
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
)

// The builder numbers an app's specs on from the newest generation handed
// over at start, and from 1 once the start has adopted what it got.
func TestBuilderGoesOnFromInheritedGenerations(t *testing.T) {
	dir := t.TempDir()
	st, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := &builder{log: hclog.NewNullLogger(), stateDir: dir, releases: &release.Store{Dir: dir}, state: st}
	b.inherit(&received{byApp: map[string][]*workers.Handover{"web": {{Generation: 3}, {Generation: 58}}}})
	app := func(name string) *config.App {
		return &config.App{Name: name, Command: []string{"/bin/sleep", "60"}, Instances: 2}
	}
	spec, err := b.spec(app("web"), &handoff.Lease{}, "")
	if err != nil || spec.Generation != 59 || spec.Instances != 2 || spec.Argv[0] != "/bin/sleep" {
		t.Fatalf("web's first spec after a handover of generation 58: %+v, %v", spec, err)
	}
	b.inherit(nil) // the start adopted them
	if spec, err := b.spec(app("api"), &handoff.Lease{}, ""); err != nil || spec.Generation != 1 {
		t.Errorf("an app added after the start: %+v, %v, want generation 1", spec, err)
	}
	if spec, err := b.spec(app("web"), &handoff.Lease{}, ""); err != nil || spec.Generation != 60 {
		t.Errorf("web's next spec: %+v, %v, want generation 60", spec, err)
	}
}
