package jsdrain

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDetect(t *testing.T) {
	dir := t.TempDir()
	script := func(name, line string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(line+"\nconsole.log(1)\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		argv []string
		want Runtime
	}{
		{[]string{"bun", "server.js"}, Bun},
		{[]string{"/usr/local/bin/bun", "run", "start"}, Bun},
		{[]string{"bunx", "some-server"}, Bun},
		{[]string{"deno", "run", "--allow-net", "main.ts"}, Deno},
		{[]string{"env", "FOO=1", "deno", "run", "main.ts"}, Deno},
		{[]string{"sh", "-c", "cd app && exec bun server.js"}, Bun},
		{[]string{script("b.js", "#!/usr/bin/env bun")}, Bun},
		{[]string{script("d.ts", "#!/usr/bin/env -S deno run --allow-net")}, Deno},
		{[]string{script("n.js", "#!/usr/bin/env node")}, None},
		{[]string{"node", "server.js"}, None},
		{[]string{"sh", "-c", "bundle exec puma"}, None},
		{nil, None},
	} {
		if got := Detect(c.argv); got != c.want {
			t.Errorf("Detect(%q) = %q, want %q", c.argv, got, c.want)
		}
	}
}

func TestApply(t *testing.T) {
	state := t.TempDir()
	bun, err := Install(state, Bun, "SIGTERM", 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	argv, env := bun.Apply([]string{"bun", "s.js"}, []string{"PATH=/bin", "BUN_OPTIONS=--smol", "DEPLOYD_BUN=forged"})
	if !slices.Equal(argv, []string{"bun", "s.js"}) {
		t.Errorf("bun argv %q changed", argv)
	}
	wantEnv := []string{"PATH=/bin", "BUN_OPTIONS=--preload=" + bun.Preload.Path + " --smol",
		`DEPLOYD_BUN={"stopSignal":"SIGTERM","stopTimeoutMs":15000}`}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("bun env %q, want %q", env, wantEnv)
	}
	deno, err := Install(state, Deno, "SIGTERM", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := deno.Preload.Path
	for _, c := range []struct{ in, want []string }{
		{[]string{"deno", "run", "-A", "m.ts"}, []string{"deno", "run", "--preload", p, "-A", "m.ts"}},
		{[]string{"/x/deno", "m.ts"}, []string{"/x/deno", "--preload", p, "m.ts"}},
		{[]string{"deno", "serve", "m.ts"}, []string{"deno", "serve", "m.ts"}},
		{[]string{"deno", "task", "start"}, []string{"deno", "task", "start"}},
		{[]string{"sh", "-c", "deno run m.ts"}, []string{"sh", "-c", "deno run m.ts"}},
	} {
		if got, _ := deno.Apply(c.in, nil); !slices.Equal(got, c.want) {
			t.Errorf("deno argv %q: got %q, want %q", c.in, got, c.want)
		}
	}
	for _, s := range []*Spec{bun, deno} {
		fi, err := os.Stat(s.Preload.Path)
		if err != nil || fi.Mode().Perm() != 0o644 || !strings.HasPrefix(s.Preload.Path, filepath.Join(state, string(s.Runtime))+"/") {
			t.Errorf("%s preload %s: %v %v, want 0644 under state_dir/%s", s.Runtime, s.Preload.Path, fi.Mode(), err, s.Runtime)
		}
	}
	// A changed file is written again before the next start.
	if err := os.WriteFile(bun.Preload.Path, []byte("evil()"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := bun.Verify(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(bun.Preload.Path); string(got) != string(bunPreload) {
		t.Error("a changed preload was not rewritten")
	}
}
