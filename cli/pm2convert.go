package cli

// The conversion of one app of a PM2 ecosystem file (as its loader
// printed it, JSON) into an [apps.NAME] table of deployd's config, with a
// note for each setting that has no counterpart and why.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers/nodejs"
)

var appNameChars = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// pm2App converts one PM2 app; notes say what was not mapped and why.
func pm2App(app map[string]any, i int, envName, base string) (string, []string) {
	name := pm2Name(app, i)
	var b strings.Builder
	var notes []string
	line := func(key, value string) { fmt.Fprintf(&b, "%-13s = %s\n", key, value) }
	fmt.Fprintf(&b, "[apps.%s]\n", name)
	line("command", tomlList(pm2Command(app)))
	if cwd := str(app["cwd"]); cwd != "" {
		line("cwd", tomlString(cwd))
	} else if abs, err := filepath.Abs(base); err == nil {
		line("cwd", tomlString(abs))
	}
	line("instances", pm2Instances(app["instances"]))
	env, envs := pm2Env(app)
	port := env["PORT"]
	if p := envs[envName]["PORT"]; p != "" {
		port = p
	}
	if port != "" {
		line("listen", tomlList([]string{"tcp://0.0.0.0:" + port}))
	} else if nodejs.Enabled(nodejs.ModeAuto, pm2Command(app)) {
		b.WriteString("# listen: none needed: deployd binds the port the app's own listen(port) asks for, and hands it to every worker\n")
	} else {
		b.WriteString("# listen     = [\"tcp://0.0.0.0:3000\"] # CHECK: the port your app listens on, if it serves (PM2 has no such key)\n")
		notes = append(notes, name+`: listen: PM2 does not say which port the app listens on (no PORT in env): add listen = ["tcp://0.0.0.0:PORT"] if it serves`)
	}
	if app["wait_ready"] == true {
		line("ready", `"node-ipc"`)
	}
	pm2Duration(app, "listen_timeout", "ready_timeout", line)
	pm2Duration(app, "kill_timeout", "stop_timeout", line)
	if sig := str(app["kill_signal"]); sig != "" {
		line("stop_signal", tomlString(sig))
	} else {
		line("stop_signal", `"SIGINT"`) // PM2's; deployd's default is SIGTERM
	}
	if m := pm2Size(app["max_memory_restart"]); m != "" {
		line("max_memory", m)
	}
	if u := str(app["user"]); u != "" {
		line("user", tomlString(u))
	}
	if c := str(app["cron_restart"]); c != "" {
		if _, err := config.ParseRecycleAt(c); err == nil {
			line("recycle_at", tomlString(c))
		} else {
			b.WriteString("# recycle_at = \"0 4 * * *\" # CHECK: PM2's cron_restart " + strconv.Quote(c) + " is not a schedule deployd reads\n")
			notes = append(notes, fmt.Sprintf("%s: cron_restart %q: not a schedule deployd reads (%v): write recycle_at by hand", name, c, err))
		}
	}
	if len(env) > 0 {
		line("env", tomlTable(env))
	}
	if _, ok := envs[envName]; ok {
		line("environment", tomlString(envName))
	} else if envName != "" {
		notes = append(notes, fmt.Sprintf("%s: --env %s: the app has no env_%s", name, envName, envName))
	}
	if restart := pm2Restart(app); len(restart) > 0 {
		fmt.Fprintf(&b, "\n[apps.%s.restart]\n%s\n", name, strings.Join(restart, "\n"))
	}
	for _, e := range sortedKeys(envs) {
		fmt.Fprintf(&b, "\n[apps.%s.env_%s]\n", name, e)
		for _, k := range sortedKeys(envs[e]) {
			fmt.Fprintf(&b, "%s = %s\n", tomlString(k), tomlString(envs[e][k]))
		}
	}
	return b.String(), append(notes, pm2Unmapped(app, name)...)
}

// pm2Name is the app's table name: its name (or script) made a valid one.
func pm2Name(app map[string]any, i int) string {
	name := str(app["name"])
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(str(app["script"])), filepath.Ext(str(app["script"])))
	}
	name = strings.Trim(appNameChars.ReplaceAllString(name, "-"), "-.")
	if name == "" {
		name = fmt.Sprintf("app%d", i+1)
	}
	return name
}

// pm2Instances maps instances: "max" and 0 are all CPUs, -N all but N; none is 1.
func pm2Instances(v any) string {
	switch v := v.(type) {
	case string:
		if v == "max" || v == "0" {
			return `"max"`
		}
		return tomlString(v)
	case float64:
		switch {
		case v == 0:
			return `"max"`
		case v < 0:
			return tomlString(strconv.Itoa(int(v)))
		}
		return strconv.Itoa(int(v))
	}
	return "1"
}

// pm2Env is the app's env, and its env_NAME objects by NAME (PM2's
// per-environment variables, [apps.APP.env_NAME] tables in deployd).
func pm2Env(app map[string]any) (map[string]string, map[string]map[string]string) {
	env := map[string]string{}
	for k, v := range obj(app["env"]) {
		env[k] = str(v)
	}
	envs := map[string]map[string]string{}
	for key, v := range app {
		name, ok := strings.CutPrefix(key, "env_")
		if !ok || !envNameRE.MatchString(name) {
			continue
		}
		vars := map[string]string{}
		for k, v := range obj(v) {
			vars[k] = str(v)
		}
		envs[name] = vars
	}
	return env, envs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// pm2Restart is the [apps.NAME.restart] lines, sorted.
func pm2Restart(app map[string]any) []string {
	var restart []string
	if v, ok := app["max_restarts"].(float64); ok {
		restart = append(restart, fmt.Sprintf("max_restarts = %d", int(v)))
	}
	for pm2Key, key := range map[string]string{"restart_delay": "backoff", "exp_backoff_restart_delay": "backoff", "min_uptime": "stable_after"} {
		if d := pm2Ms(app[pm2Key]); d != "" {
			restart = append(restart, key+" = "+d)
			if pm2Key == "exp_backoff_restart_delay" {
				restart = append(restart, `max_backoff = "15s"`) // PM2's cap
			}
		}
	}
	sort.Strings(restart)
	return restart
}

// tomlTable is an inline table of m, keys sorted.
func tomlTable(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for j, k := range keys {
		parts[j] = tomlString(k) + " = " + tomlString(m[k])
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// pm2Command is the argv of a PM2 app: interpreter, its args, script, args.
func pm2Command(app map[string]any) []string {
	script := str(app["script"])
	interp := str(app["interpreter"])
	args := words(app["args"])
	if interp == "none" || (interp == "" && !isJS(script)) {
		return append([]string{script}, args...)
	}
	if interp == "" {
		interp = "node"
	}
	argv := []string{interp}
	argv = append(argv, words(app["node_args"])...)
	argv = append(argv, words(app["interpreter_args"])...)
	return append(append(argv, script), args...)
}

func isJS(script string) bool {
	switch filepath.Ext(script) {
	case ".js", ".mjs", ".cjs", ".ts", ".mts", ".cts", ".coffee":
		return true
	}
	return false
}

var pm2Reasons = map[string]string{
	"out_file":              "logs go to the agent's log_dir as NAME.out.log, rotated by [apps.NAME.logs]",
	"error_file":            "logs go to the agent's log_dir as NAME.err.log, rotated by [apps.NAME.logs]",
	"log_file":              "logs go to the agent's log_dir as NAME.out.log and NAME.err.log",
	"merge_logs":            "every worker's lines go to one file per app and stream",
	"log_date_format":       "the text log format has its own timestamps",
	"watch":                 "not supported: run `deployd reload NAME` from your deploy step",
	"ignore_watch":          "not supported (no watch)",
	"autorestart":           "not supported: crashed workers are always restarted",
	"shutdown_with_message": "not supported: deployd sends stop_signal; the Node.js integration drains on it",
	"increment_var":         "not supported: use DEPLOYD_WORKER (also NODE_APP_INSTANCE), 0..n-1",
	"instance_var":          "NODE_APP_INSTANCE is set to the slot (DEPLOYD_WORKER)",
	"source_map_support":    "add --enable-source-maps to node's arguments",
}

func pm2Unmapped(app map[string]any, name string) []string {
	mapped := map[string]bool{"name": true, "script": true, "args": true, "interpreter": true, "node_args": true,
		"interpreter_args": true, "cwd": true, "instances": true, "env": true, "wait_ready": true,
		"listen_timeout": true, "kill_timeout": true, "max_memory_restart": true, "user": true,
		"max_restarts": true, "restart_delay": true, "exp_backoff_restart_delay": true, "min_uptime": true,
		"kill_signal": true, "cron_restart": true}
	var out []string
	keys := make([]string, 0, len(app))
	for k := range app {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case mapped[k], strings.HasPrefix(k, "env_") && envNameRE.MatchString(strings.TrimPrefix(k, "env_")):
		case strings.HasPrefix(k, "env_"):
			out = append(out, fmt.Sprintf("%s: %s: not a name deployd takes for an environment (letters, digits, '_', '-')", name, k))
		case k == "exec_mode": // cluster is what deployd does anyway; fork: instances = 1
		case pm2Reasons[k] != "":
			out = append(out, fmt.Sprintf("%s: %s: %s", name, k, pm2Reasons[k]))
		default:
			out = append(out, fmt.Sprintf("%s: %s: no deployd equivalent known", name, k))
		}
	}
	return out
}

func pm2Duration(app map[string]any, pm2Key, key string, line func(string, string)) {
	if d := pm2Ms(app[pm2Key]); d != "" {
		line(key, d)
	}
}

// pm2Ms is a PM2 duration (ms as a number, or a string like "10s") as a
// TOML duration string.
func pm2Ms(v any) string {
	switch v := v.(type) {
	case float64:
		return fmt.Sprintf(`"%dms"`, int64(v))
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return fmt.Sprintf(`"%dms"`, n)
		}
		if v != "" {
			return tomlString(v)
		}
	}
	return ""
}

// pm2Size is PM2's max_memory_restart ("300M", "1G", "150K" or bytes).
func pm2Size(v any) string {
	switch v := v.(type) {
	case float64:
		return strconv.FormatInt(int64(v), 10)
	case string:
		s := strings.ToUpper(strings.TrimSpace(v))
		for suffix, unit := range map[string]string{"K": "KiB", "M": "MiB", "G": "GiB"} {
			if n, ok := strings.CutSuffix(s, suffix); ok {
				return tomlString(n + unit)
			}
		}
		if s != "" {
			return tomlString(s)
		}
	}
	return ""
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// words is a PM2 argument list: an array, or a string split at spaces.
func words(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		out := make([]string, len(v))
		for i, w := range v {
			out[i] = str(w)
		}
		return out
	}
	return nil
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func tomlList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = tomlString(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
