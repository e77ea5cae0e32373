package config

import (
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Per-environment variables, as PM2's ecosystem files have them: an app's
// [apps.NAME.env_production] table holds variables that apply, over those
// of its env table, when the app's `environment = "production"` selects
// it. Tables of environments not selected are checked but not used.

// envTablePrefix starts the key of an environment's table.
const envTablePrefix = "env_"

var envNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// isEnvTableKey reports whether key (of an app table) names an
// environment's table, env_NAME; env_file and env_inherit are keys of
// their own, so "file" and "inherit" cannot name an environment.
func isEnvTableKey(key string) bool {
	if key == "env_file" || key == "env_inherit" {
		return false
	}
	name, ok := strings.CutPrefix(key, envTablePrefix)
	return ok && envNameRE.MatchString(name)
}

// environments decodes the app's env_NAME tables and the environment key,
// and merges the selected table's variables over app.Env.
func (d *decoder) environments(p, sel toml.Primitive, key []string, app *App) {
	tables := map[string]toml.Primitive{}
	if all, ok := get[map[string]toml.Primitive](d, p, key); ok {
		for k, v := range all {
			if isEnvTableKey(k) {
				tables[strings.TrimPrefix(k, envTablePrefix)] = v
			}
		}
	}
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	sets := map[string]*App{}
	for _, n := range names {
		set := &App{}
		d.environ(tables[n], append(slices.Clone(key), envTablePrefix+n), set)
		sets[n] = set
	}
	app.Environments = names
	selKey := append(slices.Clone(key), "environment")
	env, ok := get[string](d, sel, selKey)
	if !ok {
		return
	}
	set, found := sets[env]
	switch {
	case env == "":
		return // explicitly none
	case !envNameRE.MatchString(env):
		d.fail(selKey, strconv.Quote(env), hint(nil, `bad environment name; use letters, digits, '_' or '-', e.g. environment = "production" with an [%s.env_production] table`, keyString(key)))
		return
	case !found:
		have := "this app has none"
		if len(names) > 0 {
			have = "this app has " + strings.Join(prefixed(names), ", ")
		}
		d.fail(selKey, strconv.Quote(env), hint(nil, "no [%s.env_%s] table (%s); add it with the variables of %q, or fix the name",
			keyString(key), env, have, env))
		return
	}
	app.Environment = env
	app.Env = mergeEnv(app.Env, set.Env)
}

func prefixed(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = envTablePrefix + n
	}
	return out
}

// mergeEnv returns base's K=V entries with over's replacing those of the
// same name, sorted.
func mergeEnv(base, over []string) []string {
	m := map[string]string{}
	for _, kv := range slices.Concat(base, over) {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
