package config

import (
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Defaults of the [apps.NAME.hooks] timeouts.
const (
	DefaultBeforeTimeout = 5 * time.Minute
	DefaultAfterTimeout  = time.Minute
)

// Hooks is the [apps.NAME.hooks] table: commands that deploy and rollback
// run in the release's folder, as the app's user. A hook written as a
// string runs through /bin/sh -c; as an array it is an argv (no shell)
// whose relative program ("./bin/migrate") is found in the release folder.
type Hooks struct {
	// Before runs before any worker of the release starts; a failure (non-zero
	// exit, timeout) refuses the deploy. nil = none.
	Before []string
	// After runs once the release serves; a failure is reported, not undone.
	After         []string
	BeforeTimeout time.Duration // default DefaultBeforeTimeout
	AfterTimeout  time.Duration // default DefaultAfterTimeout
}

type rawHooks struct {
	Before        toml.Primitive `toml:"before"`
	After         toml.Primitive `toml:"after"`
	BeforeTimeout toml.Primitive `toml:"before_timeout"`
	AfterTimeout  toml.Primitive `toml:"after_timeout"`
}

var hooksKeys = []string{"before", "after", "before_timeout", "after_timeout"}

// hooks decodes [apps.NAME.hooks]; app.Releases is already decoded.
func (d *decoder) hooks(p toml.Primitive, key []string, app *App) {
	h := &app.Hooks
	raw, ok := get[rawHooks](d, p, key)
	if !ok {
		return
	}
	k := func(name string) []string { return append(slices.Clone(key), name) }
	h.Before = d.hookCommand(raw.Before, k("before"))
	h.After = d.hookCommand(raw.After, k("after"))
	d.duration(raw.BeforeTimeout, k("before_timeout"), &h.BeforeTimeout, false)
	d.duration(raw.AfterTimeout, k("after_timeout"), &h.AfterTimeout, false)
	if !app.Releases && (h.Before != nil || h.After != nil) {
		d.fail(key, "", hint(nil, "hooks run at deploy and rollback, which need releases = true; add releases = true to [apps.%s] or remove the hooks", app.Name))
	}
}

// hookCommand decodes a hook: a string (run by /bin/sh -c) or an argv.
func (d *decoder) hookCommand(p toml.Primitive, key []string) []string {
	if !d.md.IsDefined(key...) {
		return nil
	}
	if d.md.Type(key...) == "String" {
		s, ok := get[string](d, p, key)
		if !ok {
			return nil
		}
		if strings.TrimSpace(s) == "" || strings.ContainsRune(s, 0) {
			d.fail(key, formatValue(s), hint(nil, `empty or has a NUL byte: write the shell command to run, e.g. before = "./bin/migrate && ./bin/build-assets"`))
			return nil
		}
		return []string{"/bin/sh", "-c", s}
	}
	argv, ok := get[[]string](d, p, key)
	if !ok {
		return nil
	}
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" || slices.ContainsFunc(argv, func(s string) bool { return strings.ContainsRune(s, 0) }) {
		d.fail(key, formatValue(argv), hint(nil, `empty or has a NUL byte: name the program first, e.g. before = ["./bin/migrate", "up"]`))
		return nil
	}
	return argv
}
