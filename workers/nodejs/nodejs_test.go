package nodejs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDetect(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "server")
	os.WriteFile(script, []byte("#!/usr/bin/env node\nrequire('http')\n"), 0o755)
	goBin := filepath.Join(dir, "gobin")
	os.WriteFile(goBin, []byte("\x7fELF..."), 0o755)
	for _, tt := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/usr/bin/node", "app.js"}, true},
		{[]string{"/usr/local/bin/nodejs", "--max-old-space-size=512", "app.mjs"}, true},
		{[]string{"/usr/bin/npm", "start"}, true},
		{[]string{"/usr/bin/npx", "ts-node", "src/server.ts"}, true},
		{[]string{"/usr/bin/yarn", "start"}, true},
		{[]string{"/usr/bin/pnpm", "start"}, true},
		{[]string{"/usr/bin/env", "NODE_ENV=production", "node", "app.js"}, true},
		{[]string{"/usr/bin/env", "python3", "app.py"}, false},
		{[]string{"/bin/sh", "-c", "cd web && exec node app.js"}, true},
		{[]string{"/bin/sh", "-c", "exec gunicorn app:app"}, false},
		{[]string{script}, true},
		{[]string{goBin}, false},
		{[]string{"/usr/bin/python3", "node.py"}, false},
		{nil, false},
	} {
		if got := Detect(tt.argv); got != tt.want {
			t.Errorf("Detect(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
	// A FIFO in a release folder (the app's user may own it) is not
	// opened for reading until a writer comes.
	fifo := filepath.Join(dir, "run")
	if err := syscall.Mkfifo(fifo, 0o755); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- Detect([]string{fifo}) }()
	select {
	case got := <-done:
		if got {
			t.Error("Detect(a FIFO) = true")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Detect blocked on a FIFO for 10s")
	}
	if Enabled(ModeOff, []string{"/usr/bin/node"}) || !Enabled(ModeOn, []string{"/bin/app"}) {
		t.Error("node = off/on must override detection")
	}
}

func TestEnvKeepsTheAppsNodeOptions(t *testing.T) {
	s := &Spec{Preload: &Preload{Path: "/var/lib/my state/node/preload-x.cjs"}, App: "web", ReportReady: true,
		StopSignal: "SIGTERM", StopTimeout: 30 * time.Second,
		Listeners: []Listener{{"tcp", "0.0.0.0:3000"}, {"unix", "/run/web.sock"}}}
	env := s.Env([]string{"A=1", "NODE_OPTIONS=--max-old-space-size=512 --require dotenv/config", "DEPLOYD_NODE=stale"}, 50, 51)
	get := func(k string) (string, int) {
		v, n := "", 0
		for _, kv := range env {
			if key, val, _ := strings.Cut(kv, "="); key == k {
				v, n = val, n+1
			}
		}
		return v, n
	}
	opts, n := get("NODE_OPTIONS")
	if want := `--require "/var/lib/my state/node/preload-x.cjs" --max-old-space-size=512 --require dotenv/config`; opts != want || n != 1 {
		t.Errorf("NODE_OPTIONS = %q (%d times), want %q once", opts, n, want)
	}
	raw, n := get(EnvConfig)
	var wc wireConfig
	if err := json.Unmarshal([]byte(raw), &wc); err != nil || n != 1 {
		t.Fatalf("%s = %q (%d times): %v", EnvConfig, raw, n, err)
	}
	if wc.Ctl != 50 || len(wc.Listeners) != 2 || wc.Listeners[0].FD != 51 || wc.Listeners[0].Port != 3000 ||
		wc.Listeners[1].FD != 52 || wc.Listeners[1].Path != "/run/web.sock" || !wc.Ready || wc.StopTimeoutMs != 30000 {
		t.Errorf("config %+v", wc)
	}
	if wc.HealthFD != 0 {
		t.Errorf("healthFd %d without health checks, want none", wc.HealthFD)
	}
	s.Health = true
	env = s.Env(nil, 50, 51)
	raw, _ = get(EnvConfig)
	s.Health = false
	if err := json.Unmarshal([]byte(raw), &wc); err != nil || wc.HealthFD != 53 {
		t.Errorf("with health checks: healthFd %d (%v), want 53, after the listeners' 51 and 52", wc.HealthFD, err)
	}
	env = s.Env([]string{"A=1"}, 50, 51)
	if port, _ := get("PORT"); port != "3000" {
		t.Errorf("PORT = %q, want the only TCP listener's 3000", port)
	}
	if a, _ := get("A"); a != "1" {
		t.Error("the app's own variables must stay")
	}
	env = s.Env([]string{"PORT=8080"}, 50, 51)
	if !slices.Contains(env, "PORT=8080") || slices.Contains(env, "PORT=3000") {
		t.Errorf("an app's own PORT must win: %q", env)
	}
}

func TestInstallWritesAndRepairsThePreload(t *testing.T) {
	state := t.TempDir()
	p, err := Install(state)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p.Path)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("preload %s: %v %v, want mode 0644", p.Path, fi.Mode(), err)
	}
	if di, _ := os.Stat(filepath.Dir(p.Path)); di.Mode().Perm() != 0o755 {
		t.Errorf("folder mode %v, want 0755", di.Mode().Perm())
	}
	os.WriteFile(p.Path, []byte("require('child_process').exec('evil')"), 0o644)
	if err := p.Verify(); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("Verify of a changed file: %v", err)
	}
	if err := p.Repair(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p.Path); string(b) != string(preload) {
		t.Error("Repair did not restore the embedded bytes")
	}
	os.Chmod(p.Path, 0o666)
	if err := p.Verify(); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("Verify of a world-writable file: %v", err)
	}
	if err := p.Repair(); err != nil {
		t.Fatal(err)
	}
	os.Remove(p.Path)
	os.Symlink("/etc/passwd", p.Path)
	if err := p.Verify(); err == nil {
		t.Error("Verify must refuse a symlink")
	}
	if _, err := Install(state); err != nil {
		t.Errorf("Install over a symlink: %v", err)
	}
}
