package config

import (
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
)

var appNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

type rawApp struct {
	Command      toml.Primitive `toml:"command"`
	Cwd          toml.Primitive `toml:"cwd"`
	Env          toml.Primitive `toml:"env"`
	EnvFile      toml.Primitive `toml:"env_file"`
	EnvInherit   toml.Primitive `toml:"env_inherit"`
	Instances    toml.Primitive `toml:"instances"`
	Listen       toml.Primitive `toml:"listen"`
	AllowPorts   toml.Primitive `toml:"allow_ports"`
	Ready        toml.Primitive `toml:"ready"`
	Bind         toml.Primitive `toml:"bind"`
	ReadyTimeout toml.Primitive `toml:"ready_timeout"`
	MinReady     toml.Primitive `toml:"min_ready"`
	TCPNoDelay   toml.Primitive `toml:"tcp_nodelay"`
	Balance      toml.Primitive `toml:"balance"`
	Spares       toml.Primitive `toml:"spares"`
	StopSignal   toml.Primitive `toml:"stop_signal"`
	StopTimeout  toml.Primitive `toml:"stop_timeout"`
	QuietTO      toml.Primitive `toml:"quiet_timeout"`
	Nonblocking  toml.Primitive `toml:"nonblocking"`
	MaxSurge     toml.Primitive `toml:"max_surge"`
	CanaryTO     toml.Primitive `toml:"canary_timeout"`
	CanaryAction toml.Primitive `toml:"canary_action"`
	Restart      toml.Primitive `toml:"restart"`
	Releases     toml.Primitive `toml:"releases"`
	KeepReleases toml.Primitive `toml:"keep_releases"`
	MaxMemory    toml.Primitive `toml:"max_memory"`
	CPUAffinity  toml.Primitive `toml:"cpu_affinity"`
	User         toml.Primitive `toml:"user"`
	Group        toml.Primitive `toml:"group"`
	MembersRoot  toml.Primitive `toml:"members_may_run_as_root"`
	Watchdog     toml.Primitive `toml:"watchdog"`
	RecycleAfter toml.Primitive `toml:"recycle_after"`
	RecycleAt    toml.Primitive `toml:"recycle_at"`
	Logs         toml.Primitive `toml:"logs"`
	Node         toml.Primitive `toml:"node"`
	Health       toml.Primitive `toml:"health"`
	Hooks        toml.Primitive `toml:"hooks"`
	Environment  toml.Primitive `toml:"environment"`
	rawLimits
}

type rawRestart struct {
	Backoff     toml.Primitive `toml:"backoff"`
	MaxBackoff  toml.Primitive `toml:"max_backoff"`
	MaxRestarts toml.Primitive `toml:"max_restarts"`
	Window      toml.Primitive `toml:"window"`
	StableAfter toml.Primitive `toml:"stable_after"`
}

type rawLogs struct {
	Format   toml.Primitive `toml:"format"`
	MaxSize  toml.Primitive `toml:"max_size"`
	MaxFiles toml.Primitive `toml:"max_files"`
	MaxAge   toml.Primitive `toml:"max_age"`
	Compress toml.Primitive `toml:"compress"`
	Target   toml.Primitive `toml:"target"`
}

// defaultApp is an app with every default applied.
func defaultApp(name, dir string, cpus int) *App {
	return &App{
		Name:          name,
		Cwd:           dir,
		Instances:     max(cpus, 1),
		InstancesSpec: "max",
		Ready:         Ready{Mode: ReadyNotify, Raw: string(ReadyNotify)},
		ReadyTimeout:  30 * time.Second,
		MinReady:      DefaultMinReady,
		TCPNoDelay:    true,
		Balance:       "auto",
		StopSignal:    syscall.SIGTERM,
		StopTimeout:   30 * time.Second,
		QuietTimeout:  5 * time.Second,
		MaxSurge:      1,
		CanaryAction:  "abort",
		KeepReleases:  5,
		Restart: Restart{
			Backoff:     100 * time.Millisecond,
			MaxBackoff:  10 * time.Second, // a crash loop reaches errored within the 1m window
			MaxRestarts: 10,
			Window:      time.Minute,
			StableAfter: time.Second,
		},
		Logs:  Logs{Format: "text", Target: "files", MaxSize: 100 << 20, MaxFiles: 10},
		Node:  "auto",
		Bind:  BindAuto,
		Hooks: Hooks{BeforeTimeout: DefaultBeforeTimeout, AfterTimeout: DefaultAfterTimeout},
	}
}

// apps decodes the [apps] table; names come back sorted.
func (d *decoder) apps(p toml.Primitive) (map[string]*App, []string) {
	apps := map[string]*App{}
	tables, _ := get[map[string]toml.Primitive](d, p, []string{"apps"})
	names := make([]string, 0, len(tables))
	for name := range tables {
		names = append(names, name)
	}
	sort.Strings(names)
	valid := names[:0]
	for _, name := range names {
		if app := d.app(name, tables[name]); app != nil {
			apps[name] = app
			valid = append(valid, name)
		}
	}
	return apps, valid
}

// app decodes one [apps.NAME] table; nil when it is not a table.
func (d *decoder) app(name string, p toml.Primitive) *App {
	key := []string{"apps", name}
	if !appNameRE.MatchString(name) {
		d.fail(key, "", hint(nil, "bad app name %q; use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit, e.g. [apps.web]", name))
	}
	raw, ok := get[rawApp](d, p, key)
	if !ok {
		return nil
	}
	k := func(name string) []string { return append(slices.Clone(key), name) }
	a := defaultApp(name, d.dir, d.cpus)
	d.boolean(raw.Releases, k("releases"), &a.Releases) // before command: it changes how command resolves
	d.command(raw.Command, k("command"), a)
	d.cwd(raw.Cwd, k("cwd"), a)
	d.environ(raw.Env, k("env"), a)
	d.environments(p, raw.Environment, key, a)
	d.envFile(raw.EnvFile, k("env_file"), a)
	d.envInherit(raw.EnvInherit, k("env_inherit"), a)
	d.instances(raw.Instances, k("instances"), a)
	d.listens(raw.Listen, k("listen"), a)
	d.allowPorts(raw.AllowPorts, k("allow_ports"), a)
	if s, ok := get[string](d, raw.Ready, k("ready")); ok {
		if r, err := parseReady(s); err != nil {
			d.fail(k("ready"), strconv.Quote(s), err)
		} else {
			a.Ready, a.ReadySet = r, true
		}
	}
	d.bind(raw.Bind, k("bind"), a)
	d.duration(raw.ReadyTimeout, k("ready_timeout"), &a.ReadyTimeout, false)
	d.duration(raw.MinReady, k("min_ready"), &a.MinReady, true)
	d.boolean(raw.TCPNoDelay, k("tcp_nodelay"), &a.TCPNoDelay)
	if s, ok := get[string](d, raw.Balance, k("balance")); ok {
		switch s {
		case "auto", "shared", "even", "sticky":
			a.Balance = s
		default:
			d.fail(k("balance"), strconv.Quote(s), hint(nil,
				`unknown balance; use "auto" (shared, until a worker binds the address itself: then even), "shared" (one socket all workers accept on), "even" (connections spread evenly) or "sticky" (a client IP stays on one worker)`))
		}
	}
	d.integer(raw.Spares, k("spares"), &a.Spares, 0)
	if a.Spares > 0 && (a.Balance == "shared" || a.Balance == "auto") {
		d.fail(k("spares"), strconv.Itoa(a.Spares), hint(nil,
			`spares need balance = "even" or "sticky" (a shared socket cannot keep a worker out of the rotation); set balance or spares = 0`))
	}
	if s, ok := get[string](d, raw.StopSignal, k("stop_signal")); ok {
		if sig, err := parseSignal(s); err != nil {
			d.fail(k("stop_signal"), strconv.Quote(s), err)
		} else {
			a.StopSignal = sig
		}
	}
	d.duration(raw.StopTimeout, k("stop_timeout"), &a.StopTimeout, false)
	d.duration(raw.QuietTO, k("quiet_timeout"), &a.QuietTimeout, true)
	d.boolean(raw.Nonblocking, k("nonblocking"), &a.Nonblocking)
	d.integer(raw.MaxSurge, k("max_surge"), &a.MaxSurge, 1)
	d.duration(raw.CanaryTO, k("canary_timeout"), &a.CanaryTimeout, true)
	if s, ok := get[string](d, raw.CanaryAction, k("canary_action")); ok {
		switch s {
		case "abort", "promote":
			a.CanaryAction = s
		default:
			d.fail(k("canary_action"), strconv.Quote(s), hint(nil,
				`unknown canary action; use "abort" (put the canaries back on the old release) or "promote" (roll the rest), what a hold does at canary_timeout`))
		}
	}
	d.integer(raw.KeepReleases, k("keep_releases"), &a.KeepReleases, 2)
	d.size(raw.MaxMemory, k("max_memory"), &a.MaxMemory, true)
	d.limits(raw.rawLimits, k, a)
	d.boolean(raw.CPUAffinity, k("cpu_affinity"), &a.CPUAffinity)
	a.User = d.account(raw.User, k("user"), false)
	a.Group = d.account(raw.Group, k("group"), true)
	d.boolean(raw.MembersRoot, k("members_may_run_as_root"), &a.MembersMayRunAsRoot)
	d.duration(raw.Watchdog, k("watchdog"), &a.Watchdog, true)
	d.duration(raw.RecycleAfter, k("recycle_after"), &a.RecycleAfter, true)
	if a.RecycleAfter > 0 && a.RecycleAfter < time.Second {
		d.fail(k("recycle_after"), a.RecycleAfter.String(), hint(nil, `too short to serve between replacements; use e.g. "24h" (0 = off)`))
	}
	if s, ok := get[string](d, raw.RecycleAt, k("recycle_at")); ok && strings.TrimSpace(s) != "" {
		if _, err := ParseRecycleAt(s); err != nil {
			d.fail(k("recycle_at"), strconv.Quote(s), hint(err, `not a schedule: %v; write crontab's five fields (minute hour day month weekday), e.g. "0 4 * * *" (every day at 04:00, the agent's time zone), "30 3 * * 1" or "CRON_TZ=Europe/Berlin 0 4 * * *", or @daily, @weekly; for a worker's age use recycle_after`, err))
		} else {
			a.RecycleAt = strings.TrimSpace(s)
		}
	}
	d.restart(raw.Restart, k("restart"), &a.Restart)
	d.logs(raw.Logs, k("logs"), &a.Logs)
	a.Health = d.health(raw.Health, k("health"), a.Ready)
	d.hooks(raw.Hooks, k("hooks"), a)
	if s, ok := get[string](d, raw.Node, k("node")); ok {
		switch s {
		case "auto", "on", "off":
			a.Node = s
		default:
			d.fail(k("node"), strconv.Quote(s), hint(nil, `unknown node mode; use "auto" (the Node.js integration when the command runs node), "on" or "off"`))
		}
	}
	return a
}

func (d *decoder) restart(p toml.Primitive, key []string, r *Restart) {
	raw, ok := get[rawRestart](d, p, key)
	if !ok {
		return
	}
	k := func(name string) []string { return append(slices.Clone(key), name) }
	d.duration(raw.Backoff, k("backoff"), &r.Backoff, false)
	d.duration(raw.MaxBackoff, k("max_backoff"), &r.MaxBackoff, false)
	d.integer(raw.MaxRestarts, k("max_restarts"), &r.MaxRestarts, 0)
	d.duration(raw.Window, k("window"), &r.Window, false)
	d.duration(raw.StableAfter, k("stable_after"), &r.StableAfter, false)
	if r.MaxBackoff < r.Backoff {
		d.fail(k("max_backoff"), strconv.Quote(r.MaxBackoff.String()),
			hint(nil, "must be at least backoff (%s); raise max_backoff or lower backoff", r.Backoff))
	}
}

func (d *decoder) logs(p toml.Primitive, key []string, l *Logs) {
	raw, ok := get[rawLogs](d, p, key)
	if !ok {
		return
	}
	k := func(name string) []string { return append(slices.Clone(key), name) }
	if f, ok := get[string](d, raw.Format, k("format")); ok {
		switch f {
		case "text", "raw", "json", "pm2-json":
			l.Format = f
		default:
			d.fail(k("format"), strconv.Quote(f), hint(nil, `unknown log format; use "text", "raw", "json" or "pm2-json"`))
		}
	}
	if t, ok := get[string](d, raw.Target, k("target")); ok {
		switch t {
		case "files", "journal", "both":
			l.Target = t
		default:
			d.fail(k("target"), strconv.Quote(t), hint(nil, `unknown log target; use "files" (log_dir), "journal" (the systemd journal) or "both"`))
		}
	}
	d.size(raw.MaxSize, k("max_size"), &l.MaxSize, false)
	d.integer(raw.MaxFiles, k("max_files"), &l.MaxFiles, 1)
	d.duration(raw.MaxAge, k("max_age"), &l.MaxAge, true)
	d.boolean(raw.Compress, k("compress"), &l.Compress)
}
