package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/xrash/smetrics"
)

// decoder turns the parsed TOML of one file into a Config, collecting every
// problem. Owned by one Parse call.
type decoder struct {
	md  *toml.MetaData
	ps  *problems
	env hostEnv
	dir string // the config file's folder: relative paths resolve against it
	// cpus is env.cpus(), read once per Parse.
	cpus int
	// failed holds keys whose value could not be decoded; keys below them
	// are not reported again as unknown.
	failed map[string]bool
	// sockets are the addresses seen so far, for the duplicate check.
	sockets []socketSite
}

// fail records err (its text says what is wrong and how to fix it).
func (d *decoder) fail(key []string, value string, err error) {
	d.ps.add(key, value, err.Error(), errors.Unwrap(err))
}

// get decodes the value at key into a T. It returns false when the key is
// not in the file or has the wrong type (a problem is recorded then).
func get[T any](d *decoder, p toml.Primitive, key []string) (T, bool) {
	var v T
	if !d.md.IsDefined(key...) {
		return v, false
	}
	err := primitiveDecode(d.md, p, &v)
	if _, isMap := any(v).(map[string]toml.Primitive); isMap && err == nil {
		// The library decodes a non-table into a map as an empty map, without
		// an error; implicit tables ([apps.web] creates apps) have no type.
		if t := d.md.Type(key...); t != "" && t != "Hash" {
			err = fmt.Errorf("toml: %s is a %s, not a table", keyString(key), t)
		}
	}
	if err != nil {
		d.typeProblem(key, p, want(v), err)
		return v, false
	}
	return v, true
}

// primitiveDecode is MetaData.PrimitiveDecode, with the library's panics
// (found by FuzzParse: two tables whose names differ only in case, like
// [apps.web] and [apPs.web]) turned into an error.
func primitiveDecode(md interface {
	PrimitiveDecode(toml.Primitive, any) error
}, p toml.Primitive, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("toml: this value cannot be read (%v); look for two tables whose names differ only in case", r)
		}
	}()
	return md.PrimitiveDecode(p, v)
}

// typeProblem reports a value of the wrong TOML type; err is the TOML
// library's decode error.
func (d *decoder) typeProblem(key []string, p toml.Primitive, want string, err error) {
	d.failed[keyString(key)] = true
	var raw any
	_ = primitiveDecode(d.md, p, &raw)
	msg := fmt.Sprintf("wrong type: found %s, want %s", tomlTypeName(d.md.Type(key...)), want)
	if ex := example(key); ex != "" {
		msg += "; write it like " + ex
	}
	d.ps.add(key, formatValue(raw), msg, err)
}

// want describes the TOML type that decodes into v's type.
func want(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case []string:
		return "an array of strings"
	case bool:
		return "true or false"
	case int64:
		return "an integer"
	default:
		return "a table"
	}
}

func tomlTypeName(t string) string {
	switch t {
	case "String":
		return "a string"
	case "Integer":
		return "an integer"
	case "Float":
		return "a float"
	case "Bool":
		return "a boolean"
	case "Array":
		return "an array"
	case "Hash":
		return "a table"
	case "ArrayHash":
		return "an array of tables"
	case "":
		return "a value"
	default:
		return "a " + strings.ToLower(t)
	}
}

// formatValue writes a decoded TOML value back roughly as TOML, shortened.
func formatValue(v any) string {
	var s string
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		s = strconv.Quote(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = formatValue(e)
		}
		s = "[" + strings.Join(parts, ", ") + "]"
	case []map[string]any:
		s = "[{...}]"
	case map[string]any:
		s = "{...}"
	case time.Time:
		s = v.Format(time.RFC3339)
	default:
		s = fmt.Sprint(v)
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// The keys of each table, in the order the docs list them.
var (
	topKeys     = []string{"agent", "apps"}
	agentKeys   = []string{"socket", "socket_group", "state_dir", "log_dir", "upgrade_timeout", "pid_file", "metrics", "upgrade_public_key", "stream_timeout"}
	appKeys     = []string{"command", "cwd", "env", "env_file", "env_inherit", "instances", "listen", "bind", "allow_ports", "ready", "ready_timeout", "min_ready", "tcp_nodelay", "balance", "spares", "stop_signal", "stop_timeout", "quiet_timeout", "nonblocking", "max_surge", "canary_timeout", "canary_action", "restart", "releases", "keep_releases", "max_memory", "memory_high", "memory_max", "cpu_weight", "cpu_max", "pids_max", "io_weight", "cpu_affinity", "user", "group", "members_may_run_as_root", "watchdog", "recycle_after", "recycle_at", "logs", "node", "health", "hooks", "environment"}
	restartKeys = []string{"backoff", "max_backoff", "max_restarts", "window", "stable_after"}
	logsKeys    = []string{"format", "max_size", "max_files", "max_age", "compress", "target"}
	healthKeys  = []string{"path", "interval", "timeout", "failures"}
)

// examples of a value for each leaf key, for fix hints.
var examples = map[string]string{
	"socket": `"/run/deployd/deployd.sock"`, "socket_group": `"deploy"`,
	"state_dir": `"/var/lib/deployd"`, "log_dir": `"/var/log/deployd"`,
	"upgrade_timeout": `"1m"`, "pid_file": `"/run/deployd.pid"`, "stream_timeout": `"30s"`,
	"metrics": `"127.0.0.1:9901"`, "upgrade_public_key": `"RWQ..." (the second line of a minisign .pub file)`,
	"command": `["./server", "-v"]`, "cwd": `"/srv/web"`, "env": `{ MODE = "prod" }`,
	"env_file": `"/etc/deployd/web.env"`, "env_inherit": `["HTTP_PROXY", "NO_PROXY"]`,
	"instances": `"max"`, "listen": `["tcp://0.0.0.0:8080"]`, "ready": `"notify"`, "bind": `"inherit"`,
	"ready_timeout": `"30s"`, "min_ready": `"1s"`, "tcp_nodelay": `false`, "balance": `"sticky"`, "spares": `1`, "stop_signal": `"SIGTERM"`, "stop_timeout": `"30s"`, "quiet_timeout": `"5s"`,
	"nonblocking": `false`, "max_surge": `1`, "canary_timeout": `"15m"`, "canary_action": `"promote"`, "releases": `true`, "keep_releases": `5`,
	"max_memory": `"512MiB"`, "memory_high": `"400MiB"`, "memory_max": `"512MiB"`, "cpu_weight": `100`,
	"cpu_max": `"150%"`, "pids_max": `512`, "io_weight": `100`, "cpu_affinity": `true`, "user": `"www-data"`,
	"group": `"www-data"`, "members_may_run_as_root": `false`, "watchdog": `"10s"`, "recycle_after": `"24h"`, "recycle_at": `"0 4 * * *"`, "node": `"off"`, "environment": `"production" (with an [apps.NAME.env_production] table)`,
	"backoff": `"100ms"`, "max_backoff": `"10s"`, "max_restarts": `10`,
	"window": `"1m"`, "stable_after": `"1s"`,
	"format": `"text"`, "max_size": `"100MiB"`, "max_files": `10`, "max_age": `"168h"`,
	"compress": `true`,
	"path":     `"/healthz"`, "interval": `"5s"`, "timeout": `"2s"`, "failures": `3`,
	"before": `"./bin/migrate" or ["./bin/migrate", "up"]`, "after": `"./bin/notify"`,
	"before_timeout": `"5m"`, "after_timeout": `"1m"`,
}

// example returns a fix hint showing key written correctly, or "".
func example(key []string) string {
	if len(key) == 1 && key[0] == "apps" {
		return "[apps.NAME] tables, e.g. [apps.web]"
	}
	if _, ok := knownKeys(key); ok {
		return "[" + keyString(key) + "]"
	}
	last := key[len(key)-1]
	if len(key) == 4 && key[0] == "apps" && (key[2] == "env" || isEnvTableKey(key[2])) {
		return keyString([]string{last}) + ` = "value"`
	}
	if ex, ok := examples[last]; ok && len(key) >= 2 {
		return last + " = " + ex
	}
	return ""
}

// knownKeys returns the keys allowed in the table at key, and false when
// any key is allowed there (or key is not a table we check).
func knownKeys(table []string) ([]string, bool) {
	switch {
	case len(table) == 0:
		return topKeys, true
	case len(table) == 1 && table[0] == "agent":
		return agentKeys, true
	case len(table) == 2 && table[0] == "apps":
		return appKeys, true
	case len(table) == 3 && table[0] == "apps" && table[2] == "restart":
		return restartKeys, true
	case len(table) == 3 && table[0] == "apps" && table[2] == "logs":
		return logsKeys, true
	case len(table) == 3 && table[0] == "apps" && table[2] == "health":
		return healthKeys, true
	case len(table) == 3 && table[0] == "apps" && table[2] == "hooks":
		return hooksKeys, true
	}
	return nil, false
}

// unknownKeys reports the keys no field took: MetaData.Undecoded, plus
// keys the TOML library matched to a field only case-insensitively.
func (d *decoder) unknownKeys() {
	undecoded := map[string]bool{}
	for _, k := range d.md.Undecoded() {
		undecoded[k.String()] = true
	}
	reported := map[string]bool{}
	for _, k := range d.md.Keys() {
		if d.underAny(k, reported) || d.underAny(k, d.failed) {
			continue
		}
		known, checked := knownKeys(k[:len(k)-1])
		envTable := len(k) == 3 && k[0] == "apps" && isEnvTableKey(k[2])
		if undecoded[k.String()] || checked && !envTable && !slices.Contains(known, k[len(k)-1]) {
			reported[k.String()] = true
			d.ps.addf(k, "", "unknown key; %s", suggest(k[len(k)-1], known))
		}
	}
}

// underAny reports whether a proper parent of k is in set.
func (d *decoder) underAny(k toml.Key, set map[string]bool) bool {
	for n := 1; n < len(k); n++ {
		if set[k[:n].String()] {
			return true
		}
	}
	return false
}

// suggest returns `did you mean "x"? (known keys: ...)` or a plainer hint.
func suggest(got string, known []string) string {
	if len(known) == 0 {
		return "remove it"
	}
	list := "(known keys: " + strings.Join(known, ", ") + ")"
	if best := closest(got, known); best != "" {
		return fmt.Sprintf("did you mean %q? %s", best, list)
	}
	return "remove it or use one of the known keys " + list
}

// closest returns the known key nearest to got by edit distance, if near.
func closest(got string, known []string) string {
	type cand struct {
		key  string
		dist int
	}
	var cands []cand
	g := strings.ToLower(got)
	for _, k := range known {
		dist := editDistance(g, k)
		near := dist <= max(2, len(k)/3)
		if near || len(g) >= 4 && (strings.Contains(k, g) || strings.Contains(g, k)) {
			cands = append(cands, cand{k, dist})
		}
	}
	if len(cands) == 0 {
		return ""
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].dist < cands[j].dist })
	return cands[0].key
}

func editDistance(a, b string) int { return smetrics.WagnerFischer(a, b, 1, 1, 1) }
