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
