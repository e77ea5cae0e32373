package config

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestResolveInstances(t *testing.T) {
	tests := []struct {
		spec string
		cpus int
		want int
		err  string
	}{
		{"max", 8, 8, ""},
		{"MAX", 8, 8, ""},
		{"max", 0, 1, ""},
		{"4", 8, 4, ""},
		{"16", 8, 16, ""},
		{"1024", 8, 1024, ""},
		{"-1", 8, 7, ""},
		{"-0", 8, 8, ""},
		{"-7", 8, 1, ""},
		{"-100", 8, 1, ""},
		{"-9223372036854775807", 8, 1, ""},
		{"0", 8, 0, "must be at least 1"},
		{"1025", 8, 0, "at most 1024"},
		{"", 8, 0, "not a worker count"},
		{"four", 8, 0, "not a worker count"},
		{"--1", 8, 0, "not a worker count"},
		{"-+1", 8, 0, "not a worker count"},
		{"1.5", 8, 0, "not a worker count"},
	}
	for _, tt := range tests {
		got, err := resolveInstances(tt.spec, tt.cpus)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("resolveInstances(%q, %d) = %d, %v; want %d", tt.spec, tt.cpus, got, err, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("resolveInstances(%q) error %v, want %q", tt.spec, err, tt.err)
		}
	}
}

func TestInstancesInConfig(t *testing.T) {
	tests := []struct {
		value string
		want  int
		spec  string
	}{
		{`"max"`, 4, "max"},
		{`3`, 3, "3"},
		{`"3"`, 3, "3"},
		{`-1`, 3, "-1"},
		{`"-1"`, 3, "-1"},
		{`-10`, 1, "-10"},
	}
	for _, tt := range tests {
		a := loadOK(t, web+"instances = "+tt.value).Apps["web"]
		if a.Instances != tt.want || a.InstancesSpec != tt.spec {
			t.Errorf("instances = %s: got %d (%q), want %d (%q)", tt.value, a.Instances, a.InstancesSpec, tt.want, tt.spec)
		}
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
	}{
		{"SIGTERM", syscall.SIGTERM},
		{"TERM", syscall.SIGTERM},
		{"term", syscall.SIGTERM},
		{"SigInt", syscall.SIGINT},
		{"INT", syscall.SIGINT},
		{"SIGQUIT", syscall.SIGQUIT},
		{"usr1", syscall.SIGUSR1},
		{"SIGUSR2", syscall.SIGUSR2},
		{"HUP", syscall.SIGHUP},
		{"SIGWINCH", syscall.SIGWINCH},
		{" KILL ", syscall.SIGKILL},
		{"SIGFOO", 0},
		{"15", 0},
		{"", 0},
		{"SIG", 0},
	}
	for _, tt := range tests {
		got, err := parseSignal(tt.in)
		if got != tt.want || (err != nil) != (tt.want == 0) {
			t.Errorf("parseSignal(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"100", 100, true},
		{"100B", 100, true},
		{"1KB", 1000, true},
		{"1KiB", 1024, true},
		{"512MiB", 512 << 20, true},
		{"512 mib", 512 << 20, true},
		{"2MB", 2e6, true},
		{"1.5GiB", 3 << 29, true},
		{"1GB", 1e9, true},
		{"2TiB", 2 << 40, true},
		{"0", 0, true},
		{"", 0, false},
		{"MiB", 0, false},
		{"12 parsecs", 0, false},
		{"1.2.3MB", 0, false},
		{"-5MB", 0, false},
		{"99999999999TiB", 0, false},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("parseSize(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseReady(t *testing.T) {
	tests := []struct {
		in    string
		mode  ReadyMode
		delay time.Duration
		match string
		err   string
	}{
		{"notify", ReadyNotify, 0, "", ""},
		{"NOTIFY", ReadyNotify, 0, "", ""},
		{"node-ipc", ReadyNodeIPC, 0, "", ""},
		{"delay:2s", ReadyDelay, 2 * time.Second, "", ""},
		{"log:listening on :(\\d+)", ReadyLog, 0, "listening on :8080", ""},
		{"log:a:b", ReadyLog, 0, "xa:bx", ""},
		{"log:(", "", 0, "", "bad regex"},
		{"log:", "", 0, "", "empty regex"},
		{"delay:0s", "", 0, "", "not a positive duration"},
		{"delay:", "", 0, "", "not a positive duration"},
		{"node-ipc:x", "", 0, "", "takes no argument"},
		{"http", "", 0, "", `write the health path after "http:"`},
		{"http:", "", 0, "", "empty health path"},
		{"http:healthz", "", 0, "", `must start with "/"`},
		{"http:http://127.0.0.1/healthz", "", 0, "", "a path, not a URL"},
		{"http:/health z", "", 0, "", "must not contain spaces"},
		{"tcp:8080", "", 0, "", "unknown ready mode"},
		{"", "", 0, "", "unknown ready mode"},
	}
	for _, tt := range tests {
		r, err := parseReady(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseReady(%q) error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || r.Mode != tt.mode || r.Delay != tt.delay || r.Raw != tt.in {
			t.Errorf("parseReady(%q) = %+v, %v", tt.in, r, err)
		}
		if tt.match != "" && !r.Regex.MatchString(tt.match) {
			t.Errorf("parseReady(%q) does not match %q", tt.in, tt.match)
		}
	}
}

func TestHintErrorWraps(t *testing.T) {
	cause := errors.New("cause")
	err := hint(cause, "what; fix")
	if err.Error() != "what; fix" || !errors.Is(err, cause) {
		t.Errorf("hint = %q, Is(cause) = %v", err, errors.Is(err, cause))
	}
}

func TestSuggest(t *testing.T) {
	tests := []struct{ got, want string }{
		{"comand", "command"},
		{"Command", "command"},
		{"readytimeout", "ready_timeout"},
		{"stop_sginal", "stop_signal"},
		{"timeout", "stop_timeout"}, // a substring: the nearest one
		{"colour", ""},
		{"x", ""},
	}
	for _, tt := range tests {
		if got := closest(tt.got, appKeys); got != tt.want {
			t.Errorf("closest(%q) = %q, want %q", tt.got, got, tt.want)
		}
	}
}
