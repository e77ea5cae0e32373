package config

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(web))
	f.Add([]byte(web + "instances = \"-3\"\nlisten = [\"tcp://:8080#x\"]\nready = \"delay:1s\""))
	f.Add([]byte("[apps.a]\ncommand = [\"./x\"]\nreleases = true\ninstances = 2\n[apps.a.logs]\nmax_size = \"1MiB\""))
	f.Add([]byte("[agent]\nsocket = \"s\"\n[apps.b]\ncommand = [\"sh\"]\nenv = { A = \"1\" }"))
	f.Add([]byte(web + "instances = \"lots\"\ncolour = 1\n[apps.web.restart]\nbackoff = 5"))
	f.Add([]byte("[apps\nx = "))
	f.Add([]byte("apps = 1\nagent = []"))
	dir := f.TempDir()
	must(f, os.WriteFile(filepath.Join(dir, "server"), []byte("#!/bin/sh\n"), 0o755))
	path := filepath.Join(dir, "deployd.toml")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parse(path, data, fakeEnv(1000))
		if err != nil {
			if c != nil {
				t.Fatal("config and error")
			}
			if _, ok := err.(*Error); !ok || err.Error() == "" {
				t.Fatalf("error %T %q", err, err)
			}
			return
		}
		for name, app := range c.Apps {
			if app.Instances < 1 {
				t.Fatalf("app %s: %d instances", name, app.Instances)
			}
		}
		checkParsed(t, data, c)
	})
}

// checkParsed is FuzzParse's reference for an accepted config: the TOML
// read generically holds the same apps (sorted), each with its command's
// arguments, its integer instances (or the 4 CPUs of fakeEnv when absent),
// and its env.
func checkParsed(t *testing.T, data []byte, c *Config) {
	t.Helper()
	var m map[string]any
	if err := toml.Unmarshal(data, &m); err != nil {
		t.Fatalf("parse accepted TOML that does not read: %v", err)
	}
	apps, _ := m["apps"].(map[string]any)
	names := slices.Sorted(maps.Keys(apps))
	if !slices.Equal(c.AppNames, names) || len(c.Apps) != len(names) {
		t.Fatalf("apps %v (%d), the TOML has %v", c.AppNames, len(c.Apps), names)
	}
	for _, name := range names {
		raw, _ := apps[name].(map[string]any)
		app := c.Apps[name]
		if app == nil || app.Name != name {
			t.Fatalf("app %q missing or misnamed: %+v", name, app)
		}
		cmd, _ := raw["command"].([]any)
		if len(app.Command) != len(cmd) || len(cmd) == 0 {
			t.Fatalf("app %s: command %q, the TOML has %v", name, app.Command, cmd)
		}
		for i, arg := range cmd[1:] {
			if app.Command[i+1] != arg {
				t.Errorf("app %s: argument %d is %q, the TOML has %q", name, i+1, app.Command[i+1], arg)
			}
		}
		switch n := raw["instances"].(type) {
		case int64:
			if int64(app.Instances) != n {
				t.Errorf("app %s: %d instances, the TOML says %d", name, app.Instances, n)
			}
		case nil:
			if app.Instances != 4 {
				t.Errorf("app %s: %d instances, want 4 (the CPUs) by default", name, app.Instances)
			}
		}
		if env, ok := raw["env"].(map[string]any); ok {
			for k, v := range env {
				if s, isStr := v.(string); isStr && !slices.Contains(app.Env, k+"="+s) {
					t.Errorf("app %s: env %q lacks %s=%s from the TOML", name, app.Env, k, s)
				}
			}
		}
	}
}

// FuzzParseRecycleAt: any text gives a schedule or an error, never a
// panic (the cron parser has index panics the wrapper must stop), and a
// schedule it gives has a next time.
func FuzzParseRecycleAt(f *testing.F) {
	for _, s := range []string{"0 4 * * *", "*/15 * * * * *", "@daily", "CRON_TZ=UTC 0 4 * * 1-5", "TZ=UTC", "TZ= ",
		"0 4 30 2 *", "1-5/0 * * * *", "@every 1h", "0 0 L * *", "? ? ? ? ?"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sched, err := ParseRecycleAt(s)
		switch {
		case err != nil && sched != nil:
			t.Fatal("schedule and error")
		case err == nil && sched.Next(time.Now()).IsZero():
			t.Fatalf("%q: a schedule with no next time", s)
		}
	})
}
