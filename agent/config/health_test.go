package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestHealthDecodes(t *testing.T) {
	c := loadOK(t, web+"ready = \"http:/healthz?deep=1\"\nlisten = [\"tcp://127.0.0.1:8080\"]\n[apps.web.health]\ninterval = \"1s\"\ntimeout = \"500ms\"\nfailures = 2\n")
	a := c.Apps["web"]
	if a.Ready.Mode != ReadyHTTP || a.Ready.Path != "/healthz?deep=1" {
		t.Errorf("ready %+v, want http with path /healthz?deep=1", a.Ready)
	}
	want := Health{Path: "/healthz?deep=1", Interval: time.Second, Timeout: 500 * time.Millisecond, Failures: 2}
	if a.Health == nil || *a.Health != want {
		t.Errorf("health %+v, want %+v (path from ready)", a.Health, want)
	}
	if !strings.Contains(a.HealthNote(), `fd 4 (after the listen socket), named "deployd-health"`) {
		t.Errorf("note %q does not name fd 4", a.HealthNote())
	}

	c = loadOK(t, web+"[apps.web.health]\npath = \"/live\"\n")
	want = Health{Path: "/live", Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout, Failures: DefaultHealthFailures}
	if h := c.Apps["web"].Health; h == nil || *h != want || c.Apps["web"].Ready.Mode != ReadyNotify {
		t.Errorf("health %+v, want the defaults %+v beside ready = notify", h, want)
	}
	if c := loadOK(t, web); c.Apps["web"].Health != nil || c.Apps["web"].HealthNote() != "" {
		t.Errorf("no [health] table: health %+v, note %q; want none", c.Apps["web"].Health, c.Apps["web"].HealthNote())
	}
}

func TestHealthErrors(t *testing.T) {
	tests := []struct {
		name, body string
		line       int
		key, hint  string
	}{
		{"no path", web + "[apps.web.health]\ninterval = \"1s\"", 3, "apps.web.health.path", `missing: write the path the app answers health checks on, e.g. path = "/healthz"`},
		{"bad path", web + "[apps.web.health]\npath = \"healthz\"", 4, `apps.web.health.path = "healthz"`, `must start with "/"`},
		{"url path", web + "[apps.web.health]\npath = \"http://x/healthz\"", 4, "apps.web.health.path", "a path, not a URL"},
		{"zero interval", web + "[apps.web.health]\npath = \"/h\"\ninterval = \"0s\"", 5, "apps.web.health.interval", "must be more than 0"},
		{"bad timeout", web + "[apps.web.health]\npath = \"/h\"\ntimeout = \"soon\"", 5, "apps.web.health.timeout", "not a duration"},
		{"timeout over interval", web + "[apps.web.health]\npath = \"/h\"\ninterval = \"1s\"\ntimeout = \"2s\"", 6, `apps.web.health.timeout = "2s"`, "must be at most interval (1s)"},
		{"zero failures", web + "[apps.web.health]\npath = \"/h\"\nfailures = 0", 5, "apps.web.health.failures", "at least 1"},
		{"failures type", web + "[apps.web.health]\npath = \"/h\"\nfailures = \"3\"", 5, "apps.web.health.failures", "write it like failures = 3"},
		{"unknown key", web + "[apps.web.health]\npath = \"/h\"\nintervall = \"1s\"", 5, "apps.web.health.intervall", `did you mean "interval"?`},
		{"not a table", web + "health = \"/healthz\"", 3, "apps.web.health", "want a table"},
		{"ready path", web + "ready = \"http:healthz\"", 3, `apps.web.ready = "http:healthz"`, `must start with "/", e.g. "/healthz"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body)
			_, err := Load(path)
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("want *Error, got %v", err)
			}
			msg := err.Error()
			for _, want := range []string{fmt.Sprintf("%s:%d:", path, tt.line), tt.key, tt.hint} {
				if !strings.Contains(msg, want) {
					t.Errorf("error does not contain %q:\n%s", want, msg)
				}
			}
		})
	}
}

// Health checks of an app whose command serves only one inherited fd are
// warned about; the same command without health checks is not.
func TestWarnsHealthOnOneFDApp(t *testing.T) {
	uv := "[apps.web]\ncommand = [\"/usr/bin/python3\", \"-m\", \"uvicorn\", \"--fd\", \"3\", \"app:app\"]\nlisten = [\"tcp://127.0.0.1:8080\"]\n"
	tests := []struct {
		name, body, key, want string
	}{
		{"uvicorn ready", uv + "ready = \"http:/healthz\"\n", `apps.web.ready = "http:/healthz"`, "uvicorn --fd N serves only that fd"},
		{"uvicorn health", uv + "[apps.web.health]\npath = \"/healthz\"\n", "apps.web.health", "gunicorn -k uvicorn.workers.UvicornWorker"},
		{"node off", "[apps.web]\ncommand = [\"/usr/bin/node\", \"app.js\"]\nnode = \"off\"\nready = \"http:/h\"\n", `apps.web.ready = "http:/h"`, `must also serve fd 3 (named "deployd-health")`},
		{"uvicorn notify", uv, "", ""},
		{"gunicorn uvicorn workers", "[apps.web]\ncommand = [\"/usr/bin/python3\", \"-m\", \"gunicorn\", \"-k\", \"uvicorn.workers.UvicornWorker\", \"--fd\", \"3\"]\nready = \"http:/h\"\n", "", ""},
		{"node on", "[apps.web]\ncommand = [\"/usr/bin/node\", \"app.js\"]\nready = \"http:/h\"\n", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(writeConfig(t, tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if len(cfg.Warnings) != 0 {
					t.Errorf("warnings %v, want none", cfg.Warnings)
				}
				return
			}
			if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0].String(), tt.key+":") ||
				!strings.Contains(cfg.Warnings[0].String(), tt.want) {
				t.Errorf("warnings %v, want one at %s saying %q", cfg.Warnings, tt.key, tt.want)
			}
		})
	}
}
