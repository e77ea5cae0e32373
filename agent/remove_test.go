package agent

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A reload that names an app no longer in the config stops that app alone
// (deployd delete), and the app forgets the count `deployd scale` set; an
// app neither in the config nor running is still unknown.
func TestNamedReloadRemovesOnlyThatApp(t *testing.T) {
	dir := t.TempDir()
	aAddr, bAddr := freeTCP(t), freeTCP(t)
	sleep, ready := `["/bin/sleep", "60"]`, `ready = "delay:50ms"`
	path := writeConfig(t, dir, appTOML("a", sleep, "tcp://"+aAddr, ready)+appTOML("b", sleep, "tcp://"+bAddr, ready))
	err := runAgent(t, path, newFakeUpgrader(false), func(a *Agent) {
		defer a.Shutdown()
		if err := a.state.update("a", func(s *AppState) { s.Instances = 2 }); err != nil {
			t.Fatal(err)
		}
		bGen := a.apps.list()[1].sup.Spec().Generation
		writeConfig(t, dir, appTOML("b", sleep, "tcp://"+bAddr, ready))
		res := reload(a, "a")
		if !strings.Contains(res, `"type":"removed"`) || !strings.Contains(res, `"ok":true`) {
			t.Errorf("reload a after it left the config: %s", res)
		}
		if a.running("a") || !a.running("b") {
			t.Errorf("after the reload of a: a runs %t, b runs %t; want only b", a.running("a"), a.running("b"))
		}
		if got := a.apps.list()[0].sup.Spec().Generation; got != bGen {
			t.Errorf("b was reloaded too: generation %d, was %d", got, bGen)
		}
		if s := a.state.get("a"); s.Instances != 0 {
			t.Errorf("a removed keeps its scaled count %d", s.Instances)
		}
		if c, err := net.DialTimeout("tcp", aAddr, time.Second); err == nil {
			c.Close()
			t.Errorf("a's listener %s still open after its removal", aAddr)
		}
		if res := reload(a, "a"); !strings.Contains(res, "unknown app") {
			t.Errorf("a second reload of a: %s, want unknown app", res)
		}
	})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
}
