package config

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// reservedEnv are set by the agent for each worker; an app cannot set them.
var reservedEnv = []string{
	"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "NOTIFY_SOCKET", "NODE_CHANNEL_FD",
	"WATCHDOG_USEC", "WATCHDOG_PID", "DEPLOYD_APP", "DEPLOYD_WORKER", "DEPLOYD_RELEASE",
}

// command decodes and resolves `command` (argv, no shell).
func (d *decoder) command(p toml.Primitive, key []string, app *App) {
	if !d.md.IsDefined(key...) {
		d.fail(key, "", hint(nil, `missing: every app needs the program to run; add e.g. command = ["./server", "-v"]`))
		return
	}
	argv, ok := get[[]string](d, p, key)
	if !ok {
		return
	}
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" {
		d.fail(key, formatValue(argv), hint(nil, `empty: name the program first; write e.g. command = ["./server", "-v"]`))
		return
	}
	path, err := d.resolveCommand(argv[0], app.Releases)
	if err != nil {
		d.fail(key, "", err)
		return
	}
	app.Command = append([]string{path}, argv[1:]...)
}

// resolveCommand makes argv[0] absolute and checks it can be run. With
// releases a relative name stays relative: it is found in the release
// folder at deploy time.
func (d *decoder) resolveCommand(name string, releases bool) (string, error) {
	switch {
	case filepath.IsAbs(name):
		return filepath.Clean(name), checkExecutable(name, name)
	case releases:
		return name, nil
	case strings.Contains(name, "/"):
		path := d.abs(name)
		return path, checkExecutable(name, path)
	}
	path, err := exec.LookPath(name)
	if err != nil { // also exec.ErrDot: a program found in . is not taken
		return name, hint(err, `%s: not found in PATH; install it, or write its path, e.g. command = ["/usr/bin/%s"] or ["./%s"]`, name, name, name)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path, nil
}

// checkExecutable checks that path (written as name) is an executable file.
func checkExecutable(name, path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return hint(err, "%s: no such file (resolved to %s); fix the path or build the binary", name, path)
	case err != nil:
		return hint(err, "%s: cannot stat %s: %v; fix the path or its permissions", name, path, err)
	case fi.IsDir():
		return hint(nil, "%s: is a directory (resolved to %s); name the program inside it", name, path)
	case fi.Mode()&0o111 == 0:
		return hint(nil, "%s: not executable (resolved to %s); run chmod +x %s", name, path, path)
	}
	return nil
}

// cwd decodes `cwd`, which must be an existing directory.
func (d *decoder) cwd(p toml.Primitive, key []string, app *App) {
	if !d.md.IsDefined(key...) {
		return
	}
	dir := d.path(p, key, "")
	if dir == "" {
		return
	}
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		d.fail(key, strconv.Quote(dir), hint(err, "no such directory; create it or fix the path (relative paths start at the config file's folder)"))
	case !fi.IsDir():
		d.fail(key, strconv.Quote(dir), hint(nil, "not a directory; name the folder the app runs in"))
	default:
		app.Cwd = dir
	}
}

// environ decodes `env` into sorted K=V entries.
func (d *decoder) environ(p toml.Primitive, key []string, app *App) {
	vars, ok := get[map[string]toml.Primitive](d, p, key)
	if !ok {
		return
	}
	names := make([]string, 0, len(vars))
	for name := range vars {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		vkey := append(slices.Clone(key), name)
		value, ok := get[string](d, vars[name], vkey)
		if !ok {
			continue
		}
		switch {
		case name == "" || strings.ContainsAny(name, "=\x00"):
			d.fail(vkey, "", hint(nil, `bad variable name: it must be non-empty, without '='; write e.g. env = { MODE = "prod" }`))
		case slices.Contains(reservedEnv, name):
			d.fail(vkey, "", hint(nil, "set by the agent for every worker; remove it"))
		case strings.ContainsRune(value, 0):
			d.fail(vkey, "", hint(nil, "value contains a NUL byte, which the environment cannot hold; remove it"))
		default:
			app.Env = append(app.Env, name+"="+value)
		}
	}
	sort.Strings(app.Env)
}
