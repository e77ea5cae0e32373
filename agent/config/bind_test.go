package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// An app with a TCP listen whose command is not node has its binds
// answered and, unless it names ready, is ready once they are; bind =
// "inherit", a Node.js command or unix listens only turn it off.
func TestBindDefaults(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		traps       bool
		ready       ReadyMode
	}{
		{"tcp listen", `listen = ["tcp://127.0.0.1:8080"]`, true, ReadyBind},
		{"ready named", "listen = [\"tcp://127.0.0.1:8080\"]\nready = \"notify\"", true, ReadyNotify},
		{"ready bind named", "listen = [\"tcp://127.0.0.1:8080\"]\nready = \"bind\"", true, ReadyBind},
		{"inherit", "listen = [\"tcp://127.0.0.1:8080\"]\nbind = \"inherit\"", false, ReadyNotify},
		{"unix only", `listen = ["unix:///run/web.sock"]`, false, ReadyNotify},
		{"no listen", ``, false, ReadyNotify},
		{"node", "listen = [\"tcp://127.0.0.1:8080\"]\nnode = \"on\"", false, ReadyNotify},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := loadOK(t, web+tc.extra)
			a := c.Apps["web"]
			if a.TrapsBind() != tc.traps || a.Ready.Mode != tc.ready {
				t.Errorf("traps %t, ready %s; want %t, %s", a.TrapsBind(), a.Ready.Mode, tc.traps, tc.ready)
			}
		})
	}
}

// A bad bind value and a kernel that cannot answer binds are refused with
// the fix; an app that does not need the trap is not.
func TestBindRefusals(t *testing.T) {
	noTrap := fakeEnv(1000)
	noTrap.trapCheck = func() error { return errors.New("no user_notif (Linux >= 5.9 is needed; or set bind = \"inherit\")") }
	for _, tc := range []struct {
		name, extra string
		env         hostEnv
		want        string // "" = accepted
	}{
		{"bad value", "listen = [\"tcp://127.0.0.1:8080\"]\nbind = \"trap\"", fakeEnv(1000), `apps.web.bind = "trap": unknown bind; use "auto"`},
		{"old kernel", `listen = ["tcp://127.0.0.1:8080"]`, noTrap, `apps.web.bind = "auto": the app's own bind cannot be answered with the agent's socket: no user_notif (Linux >= 5.9 is needed; or set bind = "inherit")`},
		{"old kernel, inherit", "listen = [\"tcp://127.0.0.1:8080\"]\nbind = \"inherit\"", noTrap, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, web+tc.extra)
			data, err := os.ReadFile(path)
			must(t, err)
			_, err = parse(path, data, tc.env)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
