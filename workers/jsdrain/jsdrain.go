// Package jsdrain drains Bun and Deno apps on the stop signal as deployd's
// Node.js preload drains node's: it owns the preloads the agent's binary
// embeds (common.js followed by bun.js or deno.js: wrap Bun.serve and Deno.serve, then on the stop
// signal "Connection: close" on every response, stop accepting after a
// short close window, exit once no request is in flight), tells from a
// command whether it runs bun or deno, and changes a worker's argv and env
// so that the runtime loads its preload: BUN_OPTIONS="--preload=FILE" for
// Bun (which reaches bun through npm and sh too), `deno run --preload FILE`
// for Deno (Deno has no variable for it, so only a command that names deno
// itself gets it; another falls back to the agent's quiet stop).
package jsdrain

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/deployd/deployd/workers/nodejs"
)

var (
	//go:embed common.js
	common []byte
	//go:embed bun.js
	bunOwn []byte
	//go:embed deno.js
	denoOwn []byte

	// The files the agent writes: the shared part, then the runtime's.
	bunPreload  = append(append([]byte(nil), common...), bunOwn...)
	denoPreload = append(append([]byte(nil), common...), denoOwn...)
)

// Runtime is a JavaScript runtime this package drains.
type Runtime string

// Runtimes.
const (
	None Runtime = ""
	Bun  Runtime = "bun"
	Deno Runtime = "deno"
)

// Env variables that carry each preload's JSON config; the Bun preload
// does nothing without its own.
const (
	EnvBun  = "DEPLOYD_BUN"
	EnvDeno = "DEPLOYD_DENO"
)

// Spec is what a Bun or Deno worker's start needs. Read-only once built.
type Spec struct {
	Runtime     Runtime
	Preload     *nodejs.Preload
	StopSignal  string // e.g. SIGTERM
	StopTimeout time.Duration
}

// Install writes the runtime's preload under stateDir/<runtime> (folder
// 0755, file 0644, both the agent's: readable by workers of any user) and
// returns the Spec; nil for None.
func Install(stateDir string, rt Runtime, stopSignal string, stopTimeout time.Duration) (*Spec, error) {
	var data []byte
	switch rt {
	case Bun:
		data = bunPreload
	case Deno:
		data = denoPreload
	default:
		return nil, nil
	}
	h := sha256.Sum256(data)
	p, err := nodejs.InstallFile(filepath.Join(stateDir, string(rt)), "preload-"+hex.EncodeToString(h[:8])+".js", data)
	if err != nil {
		return nil, fmt.Errorf("%s drain preload: %w", rt, err)
	}
	return &Spec{Runtime: rt, Preload: p, StopSignal: stopSignal, StopTimeout: stopTimeout}, nil
}

type wireConfig struct {
	StopSignal    string `json:"stopSignal,omitempty"`
	StopTimeoutMs int64  `json:"stopTimeoutMs"`
}

// Verify checks the preload file before a start and rewrites it if it was
// changed.
func (s *Spec) Verify() error {
	if err := s.Preload.Repair(); err != nil {
		return fmt.Errorf("%s drain preload: %w", s.Runtime, err)
	}
	return nil
}

// Apply returns argv and env for one start, with the preload the runtime
// loads (Verify it first).
// Bun: BUN_OPTIONS gets "--preload=FILE" in front of the app's own.
// Deno: "--preload FILE" after `run` (or after deno, for `deno FILE`);
// a command that does not name deno itself is left as it is.
func (s *Spec) Apply(argv, env []string) ([]string, []string) {
	b, _ := json.Marshal(wireConfig{StopSignal: s.StopSignal, StopTimeoutMs: s.StopTimeout.Milliseconds()}) // plain types
	out := make([]string, 0, len(env)+2)
	opts := ""
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == EnvBun || k == EnvDeno:
			continue
		case k == "BUN_OPTIONS" && s.Runtime == Bun:
			opts = v
			continue
		}
		out = append(out, kv)
	}
	switch s.Runtime {
	case Bun:
		// The = form: bun run <script> misreads "--preload FILE" from the
		// variable (it prints its usage and exits).
		o := "--preload=" + quote(s.Preload.Path)
		if opts != "" {
			o += " " + opts
		}
		return argv, append(out, "BUN_OPTIONS="+o, EnvBun+"="+string(b))
	case Deno:
		return denoArgv(argv, s.Preload.Path), append(out, EnvDeno+"="+string(b))
	}
	return argv, env
}

// denoArgv puts --preload path into a deno command: `deno run [flags]
// script` and `deno script` (Deno 2's shorthand for run). Any other form
// (another subcommand, deno under env or a shell) is returned unchanged.
func denoArgv(argv []string, path string) []string {
	if len(argv) < 2 || !denoNames[filepath.Base(argv[0])] {
		return argv
	}
	at := 1
	switch {
	case argv[1] == "run":
		at = 2
	case strings.HasPrefix(argv[1], "-"), !looksLikeScript(argv[1]):
		return argv
	}
	out := make([]string, 0, len(argv)+2)
	out = append(out, argv[:at]...)
	out = append(out, "--preload", path)
	return append(out, argv[at:]...)
}

func looksLikeScript(a string) bool {
	for _, ext := range []string{".js", ".mjs", ".cjs", ".ts", ".mts", ".cts", ".jsx", ".tsx"} {
		if strings.HasSuffix(a, ext) {
			return true
		}
	}
	return strings.Contains(a, "://")
}

// quote quotes p for BUN_OPTIONS when it needs it (bun splits the variable
// at spaces and honours double quotes).
func quote(p string) string {
	if !strings.ContainsAny(p, " \t\"\\") {
		return p
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(p) + `"`
}
