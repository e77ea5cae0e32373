package agent

import "testing"

// Each app counts its own generations from 1; an app whose workers an
// earlier agent started goes on from the newest of them.
func TestGenerationsArePerApp(t *testing.T) {
	var g generations
	none := func() int { return 0 }
	for _, step := range []struct {
		app  string
		seen func() int
		want int
	}{
		{"web", none, 1},
		{"api", none, 1},
		{"web", none, 2},
		{"adopted", func() int { return 58 }, 59},
		{"adopted", func() int { t.Error("seen asked again"); return 0 }, 60},
		{"api", none, 2},
	} {
		if got := g.next(step.app, step.seen); got != step.want {
			t.Errorf("next(%s) = %d, want %d", step.app, got, step.want)
		}
	}
}

// Two apps just started both show generation 1, and a reload of one moves
// only its own on.
func TestAgentStartsEachAppAtGenerationOne(t *testing.T) {
	dir := t.TempDir()
	sleep, ready := `["/bin/sleep", "60"]`, `ready = "delay:50ms"`
	path := writeConfig(t, dir, appTOML("a", sleep, "tcp://"+freeTCP(t), ready)+appTOML("b", sleep, "tcp://"+freeTCP(t), ready))
	err := runAgent(t, path, newFakeUpgrader(false), func(a *Agent) {
		defer a.Shutdown()
		for _, rt := range a.apps.list() {
			if got := rt.sup.Spec().Generation; got != 1 {
				t.Errorf("app %s just started at generation %d, want 1", rt.name, got)
			}
		}
		reload(a, "a")
		for _, rt := range a.apps.list() {
			if want := map[string]int{"a": 2, "b": 1}[rt.name]; rt.sup.Spec().Generation != want {
				t.Errorf("after a reload of a, app %s is at generation %d, want %d", rt.name, rt.sup.Spec().Generation, want)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
