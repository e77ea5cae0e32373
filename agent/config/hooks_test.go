package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

const releasesWeb = web + "releases = true\n" // lines 1-3

func TestHooks(t *testing.T) {
	c := loadOK(t, releasesWeb+"[apps.web.hooks]\nbefore = \"./migrate && echo ok\"\nafter = [\"./notify\", \"--done\"]\nafter_timeout = \"10s\"\n")
	h := c.Apps["web"].Hooks
	if want := []string{"/bin/sh", "-c", "./migrate && echo ok"}; !slices.Equal(h.Before, want) {
		t.Errorf("before %q, want %q", h.Before, want)
	}
	if want := []string{"./notify", "--done"}; !slices.Equal(h.After, want) {
		t.Errorf("after %q, want %q", h.After, want)
	}
	if h.BeforeTimeout != DefaultBeforeTimeout || h.AfterTimeout != 10*time.Second {
		t.Errorf("timeouts %s %s, want %s 10s", h.BeforeTimeout, h.AfterTimeout, DefaultBeforeTimeout)
	}
	none := loadOK(t, web).Apps["web"].Hooks
	if none.Before != nil || none.After != nil || none.BeforeTimeout != DefaultBeforeTimeout || none.AfterTimeout != DefaultAfterTimeout {
		t.Errorf("no hooks table: %+v", none)
	}
}

func TestHooksErrors(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		line       int
		key, hint  string
	}{
		{"without releases", web + "[apps.web.hooks]\nbefore = \"true\"", 3, "apps.web.hooks", "need releases = true"},
		{"empty string", releasesWeb + "[apps.web.hooks]\nbefore = \" \"", 5, "apps.web.hooks.before", "write the shell command to run"},
		{"empty argv", releasesWeb + "[apps.web.hooks]\nafter = []", 5, "apps.web.hooks.after", "name the program first"},
		{"wrong type", releasesWeb + "[apps.web.hooks]\nbefore = 3", 5, "apps.web.hooks.before", "wrong type"},
		{"bad timeout", releasesWeb + "[apps.web.hooks]\nbefore_timeout = \"0s\"", 5, "apps.web.hooks.before_timeout", "must be more than 0"},
		{"unknown key", releasesWeb + "[apps.web.hooks]\nbefor = \"x\"", 5, "apps.web.hooks.befor", `did you mean "before"?`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tt.body))
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("want *Error, got %v", err)
			}
			for _, want := range []string{fmt.Sprintf(":%d:", tt.line), tt.key, tt.hint} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q:\n%v", want, err)
				}
			}
		})
	}
}
