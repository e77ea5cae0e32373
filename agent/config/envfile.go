package config

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/safeopen"
)

// MaxEnvFile is the largest env_file the agent reads.
const MaxEnvFile = 1 << 20

// agentOwnedPrefixes are the variable prefixes that belong to the agent
// and never pass to a worker or a hook through env_inherit.
var agentOwnedPrefixes = []string{"LISTEN_", "DEPLOYD_", "TABLEFLIP_", "WATCHDOG_"}

// envInherit decodes `env_inherit`: names of the agent's own variables
// that pass to the app's workers and hooks.
func (d *decoder) envInherit(p toml.Primitive, key []string, app *App) {
	names, ok := get[[]string](d, p, key)
	if !ok {
		return
	}
	for _, name := range names {
		if err := checkEnvName(name); err != nil {
			d.fail(key, strconv.Quote(name), err)
			continue
		}
		if !slices.Contains(app.EnvInherit, name) {
			app.EnvInherit = append(app.EnvInherit, name)
		}
	}
	sort.Strings(app.EnvInherit)
}

// checkEnvName refuses a variable name that is empty, holds '=' or NUL, or
// belongs to the agent.
func checkEnvName(name string) error {
	switch {
	case name == "" || strings.ContainsAny(name, "=\x00"):
		return hint(nil, `bad variable name: it must be non-empty, without '='; write e.g. env_inherit = ["HTTP_PROXY"]`)
	case slices.Contains(reservedEnv, name) || name == "NODE_CHANNEL_SERIALIZATION_MODE":
		return hint(nil, "%s is set by the agent for every worker; remove it", name)
	}
	for _, p := range agentOwnedPrefixes {
		if strings.HasPrefix(name, p) {
			return hint(nil, "%s* variables belong to the agent; remove it", p)
		}
	}
	return nil
}

// envFile decodes `env_file` and adds the file's variables to app.Env
// (after environ: a name in both is a problem). The agent reads the file
// itself when it loads the config; see readEnvFile for what it accepts.
func (d *decoder) envFile(p toml.Primitive, key []string, app *App) {
	if !d.md.IsDefined(key...) {
		return
	}
	path := d.path(p, key, "")
	if path == "" {
		return
	}
	app.EnvFile = path // named even when it is refused: checkFolders looks at its folder too
	vars, err := readEnvFile(path, d.env.euid)
	if err != nil {
		d.fail(key, strconv.Quote(path), err)
		return
	}
	have := map[string]bool{}
	for _, kv := range app.Env {
		name, _, _ := strings.Cut(kv, "=")
		have[name] = true
	}
	for _, kv := range vars {
		name, _, _ := strings.Cut(kv, "=")
		if have[name] {
			d.fail(key, strconv.Quote(path), hint(nil, "%s is set both in env and in the env_file; keep one", name))
			continue
		}
		app.Env = append(app.Env, kv)
	}
	sort.Strings(app.Env)
}

// readEnvFile reads the variables of an env_file: one NAME=value a line;
// blank lines and lines starting with '#' are skipped, an "export " before
// the name is allowed, spaces around the name and the value are dropped, and a value wrapped in a pair of matching quotes
// (' or ") loses them; nothing else is interpreted (no $ expansion, no
// escapes). The file must be a regular file reached without a link at any
// component of its path (a folder swapped for a link is refused, not
// followed), owned by root or by euid (the agent's user), writable by its
// owner alone, at most MaxEnvFile bytes. No message quotes the file's
// contents: they are secrets.
func readEnvFile(path string, euid int) ([]string, error) {
	f, err := safeopen.Open(path)
	if err != nil {
		switch {
		case errors.Is(err, safeopen.ErrSymlink):
			return nil, hint(err, "a folder or file on the env_file's path is a symbolic link; deployd follows none there: name the file by its real path, in a folder only root can write")
		case errors.Is(err, safeopen.ErrNotRegular):
			return nil, hint(err, "env_file is %v; name a file", errors.Unwrap(err))
		}
		return nil, hint(err, "cannot open the env_file: %v; check the path and that the agent's user can read it", errors.Unwrap(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, hint(err, "cannot stat the env_file: %v", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, hint(nil, "env_file is not a regular file (%s); name a file", fi.Mode().Type())
	case st != nil && st.Uid != 0 && int(st.Uid) != euid:
		return nil, hint(nil, "env_file is owned by uid %d; it must be owned by root or by the agent's user (uid %d): chown root %s", st.Uid, euid, path)
	case fi.Mode().Perm()&0o022 != 0:
		return nil, hint(nil, "env_file is group- or world-writable (mode %04o); another user could change what the workers get: chmod go-w %s (0600 or 0400 is best)", fi.Mode().Perm(), path)
	case fi.Size() > MaxEnvFile:
		return nil, hint(nil, "env_file is %d bytes, more than the %d bytes the agent reads", fi.Size(), MaxEnvFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxEnvFile+1))
	if err != nil {
		return nil, hint(err, "cannot read the env_file: %v", err)
	}
	if len(b) > MaxEnvFile {
		return nil, hint(nil, "env_file is more than the %d bytes the agent reads", MaxEnvFile)
	}
	return parseEnvFile(b)
}

// parseEnvFile parses an env_file's contents (readEnvFile); later lines
// win over earlier ones with the same name.
func parseEnvFile(b []byte) ([]string, error) {
	at := map[string]int{}
	var out []string
	for i, line := range bytes.Split(b, []byte("\n")) {
		n := i + 1
		s := strings.TrimSpace(strings.TrimSuffix(string(line), "\r"))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		s = strings.TrimPrefix(s, "export ")
		name, value, ok := strings.Cut(s, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok {
			return nil, hint(nil, "env_file line %d: not NAME=value", n)
		}
		if err := checkEnvName(name); err != nil || strings.ContainsAny(name, " \t") {
			return nil, hint(nil, "env_file line %d: bad variable name (a name without spaces, '=' or the agent's own)", n)
		}
		if strings.ContainsRune(value, 0) {
			return nil, hint(nil, "env_file line %d: the value holds a NUL byte, which the environment cannot hold", n)
		}
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			value = value[1 : len(value)-1]
		}
		if j, seen := at[name]; seen {
			out[j] = name + "=" + value
			continue
		}
		at[name] = len(out)
		out = append(out, name+"="+value)
	}
	return out, nil
}
