package config

import (
	"strings"
	"testing"

	"github.com/deployd/deployd/internal/addrpolicy"
)

func TestParseListen(t *testing.T) {
	tests := []struct {
		url, network, address, name, err string
	}{
		{"tcp://0.0.0.0:8080", "tcp", "0.0.0.0:8080", "web", ""},
		{"tcp://:8080", "tcp", ":8080", "web", ""},
		{"tcp://localhost:8080#admin", "tcp", "localhost:8080", "admin", ""},
		{"TCP://127.0.0.1:1", "tcp", "127.0.0.1:1", "web", ""},
		{"tcp4://127.0.0.1:65535", "tcp4", "127.0.0.1:65535", "web", ""},
		{"tcp6://[::1]:80", "tcp6", "[::1]:80", "web", ""},
		{"tcp://[::]:80", "tcp", "[::]:80", "web", ""},
		{"unix:///run/web.sock", "unix", "/run/web.sock", "web", ""},
		{"unix://web.sock#api", "unix", "/cfg/web.sock", "api", ""},
		{"unix://sub/../web.sock", "unix", "/cfg/web.sock", "web", ""},
		{"", "", "", "", "not a listen URL"},
		{":8080", "", "", "", "not a listen URL"},
		{"udp://:53", "", "", "", `unsupported scheme "udp"`},
		{"http://:80", "", "", "", "unsupported scheme"},
		{"tcp://0.0.0.0", "", "", "", "missing or bad port"},
		{"tcp://0.0.0.0:", "", "", "", "bad port"},
		{"tcp://:+80", "", "", "", "bad port"},
		{"tcp://:65536", "", "", "", "bad port"},
		{"tcp://:0", "", "", "", "port 0 is not allowed"},
		{"tcp://:80?reuseport=1", "", "", "", "query strings are not supported"},
		{"unix:///a.sock?x", "", "", "", "query strings are not supported"},
		{"tcp://:80#", "", "", "", "bad name after #"},
		{"tcp://:80#a b", "", "", "", "bad name after #"},
		{"tcp://u@host:80", "", "", "", "only host:port"},
		{"tcp://host:80/path", "", "", "", "only host:port"},
		{"tcp://::1:80", "", "", "", "missing or bad port"},
		{"tcp4://[::1]:80", "", "", "", "does not fit tcp4"},
		{"tcp6://127.0.0.1:80", "", "", "", "does not fit tcp6"},
		{"unix://", "", "", "", "missing socket path"},
	}
	for _, tt := range tests {
		l, err := parseListen(tt.url, "web", "/cfg")
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseListen(%q) error %v, want %q", tt.url, err, tt.err)
			}
			continue
		}
		if err != nil || l.Network != tt.network || l.Address != tt.address || l.Name != tt.name || l.URL != tt.url {
			t.Errorf("parseListen(%q) = %+v, %v", tt.url, l, err)
		}
	}
}

func TestConflicts(t *testing.T) {
	tests := []struct {
		a, b     string
		conflict bool
	}{
		{"tcp://:80", "tcp://:80", true},
		{"tcp://0.0.0.0:80", "tcp://127.0.0.1:80", true},
		{"tcp://127.0.0.1:80", "tcp://:80", true},
		{"tcp://[::]:80", "tcp4://10.0.0.1:80", true},
		{"tcp://0.0.0.0:80", "tcp6://[::1]:80", true}, // Go listens dual-stack on 0.0.0.0 with "tcp"
		{"tcp://127.0.0.1:80", "tcp://127.0.0.1:80", true},
		{"tcp://localhost:80", "tcp://LOCALHOST:80", true},
		{"tcp://[::ffff:127.0.0.1]:80", "tcp://127.0.0.1:80", true},
		{"tcp://127.0.0.1:80", "tcp://127.0.0.2:80", false},
		{"tcp://:80", "tcp://:81", false},
		{"tcp4://0.0.0.0:80", "tcp6://[::]:80", false},
		{"tcp4://:80", "tcp6://[::1]:80", false},
		{"tcp://127.0.0.1:80", "tcp://[::1]:80", false},
		{"unix:///a.sock", "unix:///a.sock", true},
		{"unix:///a.sock", "unix:///b.sock", false},
		{"unix:///80", "tcp://:80", false},
	}
	for _, tt := range tests {
		a, errA := parseListen(tt.a, "web", "/cfg")
		b, errB := parseListen(tt.b, "web", "/cfg")
		if errA != nil || errB != nil {
			t.Fatalf("parse: %v, %v", errA, errB)
		}
		sa, sb := socketSite{l: a}, socketSite{l: b}
		if got := sa.conflicts(sb); got != tt.conflict || sb.conflicts(sa) != got {
			t.Errorf("%s vs %s: conflict = %v, want %v", tt.a, tt.b, got, tt.conflict)
		}
	}
}

func TestConflictNamesBothPlaces(t *testing.T) {
	body := "[apps.b]\ncommand = [\"./server\"]\nlisten = [\"tcp://:80\"]\n" +
		"[apps.a]\ncommand = [\"./server\"]\nlisten = [\"tcp://0.0.0.0:80\"]\n"
	path := writeConfig(t, body)
	_, err := Load(path)
	want := path + `:6: apps.a.listen = "tcp://0.0.0.0:80": address conflicts with "tcp://:80" of apps.b.listen (` + path + ":3)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func TestAllowPorts(t *testing.T) {
	body := "[apps.web]\ncommand = [\"node\", \"app.js\"]\nallow_ports = [\"80\", \"8000-8099\"]\n"
	cfg, err := Load(writeConfig(t, body))
	if err != nil {
		t.Fatal(err)
	}
	if got := addrpolicy.FormatRanges(cfg.Apps["web"].AllowPorts); got != "80, 8000-8099" {
		t.Errorf("allow_ports = %s", got)
	}
	path := writeConfig(t, "[apps.web]\ncommand = [\"node\", \"app.js\"]\nallow_ports = [\"90-80\"]\n")
	_, err = Load(path)
	if want := `apps.web.allow_ports = ["90-80"]: bad port or range "90-80"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant %s", err, want)
	}
}
