package config

import (
	"strings"
	"testing"
)

func TestWarnsLogReadinessWithoutListen(t *testing.T) {
	path := writeConfig(t, web+"ready = \"log:listening\"\n[apps.api]\ncommand = [\"./server\"]\nlisten = [\"tcp://127.0.0.1:8080\"]\nready = \"log:up\"\n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 {
		t.Fatalf("warnings: %v, want one for apps.web", cfg.Warnings)
	}
	got := cfg.Warnings[0].String()
	want := path + `:3: apps.web.ready = "log:listening": the app has no listen, and its readiness is a log line`
	if !strings.HasPrefix(got, want) || !strings.Contains(got, `add listen = ["tcp://HOST:PORT"]`) {
		t.Errorf("warning:\n  %s\nwant it to start with\n  %s", got, want)
	}

	cfg, err = Load(writeConfig(t, web+"ready = \"delay:1s\"\n"))
	if err != nil || len(cfg.Warnings) != 0 {
		t.Errorf("delay readiness without listen: warnings %v, err %v; want none", cfg.Warnings, err)
	}
}

func TestWarnsCanaryActionWithoutTimeout(t *testing.T) {
	path := writeConfig(t, web+"canary_action = \"promote\"\n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0].String(), path+`:3: apps.web.canary_action = "promote": canary_action applies when canary_timeout`) {
		t.Fatalf("warnings: %v, want one for apps.web.canary_action", cfg.Warnings)
	}
	cfg, err = Load(writeConfig(t, web+"canary_action = \"promote\"\ncanary_timeout = \"5m\"\n"))
	if err != nil || len(cfg.Warnings) != 0 {
		t.Errorf("canary_action with canary_timeout: warnings %v, err %v; want none", cfg.Warnings, err)
	}
}

// With socket_group, an app that runs as root gets a warning: members are
// refused on it, or, with members_may_run_as_root, may run code as root.
func TestWarnsRootAppWithSocketGroup(t *testing.T) {
	group := "[agent]\nsocket_group = \"0\"\n"
	for _, tc := range []struct {
		name, body, want string
	}{
		{"no user", group + web, "apps.web.user: the app runs as root"},
		{"user root", group + web + "user = \"root\"\n", "apps.web.user: the app runs as root"},
		{"the key set", group + web + "members_may_run_as_root = true\n", "apps.web.members_may_run_as_root: members of socket_group \"0\" can run any code as root"},
	} {
		cfg, err := Load(writeConfig(t, tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0].String(), tc.want) {
			t.Errorf("%s: warnings %v, want one with %q", tc.name, cfg.Warnings, tc.want)
		}
		if tc.name != "the key set" && !strings.Contains(cfg.Warnings[0].String(), "members_may_run_as_root = true") {
			t.Errorf("%s: the warning does not name the key: %v", tc.name, cfg.Warnings)
		}
	}
	for _, body := range []string{web, group + web + "user = \"nobody\"\n"} {
		if cfg, err := Load(writeConfig(t, body)); err != nil || len(cfg.Warnings) != 0 {
			t.Errorf("%q: warnings %v, err %v; want none", body, cfg.Warnings, err)
		}
	}
}
