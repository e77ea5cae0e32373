package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// web is the start of most test configs: an app whose command exists.
const web = "[apps.web]\ncommand = [\"./server\"]\n" // lines 1-2

// writeConfig writes body as deployd.toml into a temp folder that also holds
// an executable ./server, a plain file ./data.txt and a folder ./srv.
func writeConfig(t testing.TB, body string) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "server"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "data.txt"), nil, 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "srv"), 0o755))
	path := filepath.Join(dir, "deployd.toml")
	must(t, os.WriteFile(path, []byte(body), 0o644))
	return path
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fakeEnv is a non-root user on a 4-CPU machine.
func fakeEnv(euid int) hostEnv {
	vars := map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}
	return hostEnv{
		euid:   euid,
		getenv: func(k string) string { return vars[k] },
		home:   func() (string, error) { return "/home/ann", nil },
		cpus:   func() int { return 4 },
		// A kernel that answers binds (bind_test.go pretends otherwise).
		trapCheck: func() error { return nil },
	}
}

func loadOK(t *testing.T, body string) *Config {
	t.Helper()
	path := writeConfig(t, body)
	data, err := os.ReadFile(path)
	must(t, err)
	c, err := parse(path, data, fakeEnv(1000))
	if err != nil {
		t.Fatalf("parse:\n%v\nconfig:\n%s", err, body)
	}
	return c
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name, body string
		line       int
		key, hint  string
	}{
		// unknown keys
		{"unknown key", web + `colour = "red"`, 3, "apps.web.colour", "unknown key; remove it or use one of the known keys (known keys: command, cwd"},
		{"unknown key near", web + `stop_sginal = "TERM"`, 3, "apps.web.stop_sginal", `did you mean "stop_signal"?`},
		{"unknown key case", web + `Cwd = "srv"`, 3, "apps.web.Cwd", `did you mean "cwd"?`},
		{"unknown table", web + "[agnet]\nsocket = \"x\"", 3, "agnet", `did you mean "agent"?`},
		{"unknown agent key", "[agent]\nsokcet = \"x\"", 2, "agent.sokcet", `did you mean "socket"?`},
		{"unknown restart key", web + "[apps.web.restart]\nbackof = \"1s\"", 4, "apps.web.restart.backof", `did you mean "backoff"?`},
		{"unknown logs key inline", web + `logs = { format = "text", size = 1 }`, 3, "apps.web.logs.size", "unknown key"},
		// wrong types
		{"type int", web + `max_surge = "2"`, 3, `apps.web.max_surge = "2"`, "found a string, want an integer; write it like max_surge = 1"},
		{"type bool", web + `nonblocking = "yes"`, 3, "apps.web.nonblocking", "want true or false"},
		{"tcp_nodelay type", web + `tcp_nodelay = "off"`, 3, "apps.web.tcp_nodelay", "want true or false"},
		{"balance unknown", web + `balance = "round-robin"`, 3, `apps.web.balance = "round-robin"`, `unknown balance; use "auto"`},
		{"spares without steering", web + `spares = 1`, 3, "apps.web.spares = 1", `spares need balance = "even" or "sticky"`},
		{"min_ready negative", web + `min_ready = "-1s"`, 3, "apps.web.min_ready", "must not be negative"},
		{"min_ready unit", web + `min_ready = "2"`, 3, "apps.web.min_ready", "not a duration"},
		{"canary_timeout negative", web + `canary_timeout = "-1m"`, 3, "apps.web.canary_timeout", "must not be negative"},
		{"canary_action unknown", web + `canary_action = "rollback"`, 3, `apps.web.canary_action = "rollback"`, `unknown canary action; use "abort"`},
		{"recycle_at fields", web + `recycle_at = "0 4 * *"`, 3, `apps.web.recycle_at = "0 4 * *"`, `not a schedule: expected 5 to 6 fields, found 4: [0 4 * *]; write crontab's five fields (minute hour day month weekday), e.g. "0 4 * * *"`},
		{"recycle_at range", web + `recycle_at = "0 25 * * *"`, 3, `apps.web.recycle_at`, `not a schedule: end of range (25) above maximum (23)`},
		{"recycle_at zone alone", web + `recycle_at = "TZ=UTC"`, 3, `apps.web.recycle_at = "TZ=UTC"`, "not a schedule: a time zone without a schedule after it"},
		{"recycle_at zone unknown", web + `recycle_at = "CRON_TZ=Mars/Olympus 0 4 * * *"`, 3, `apps.web.recycle_at`, `not a schedule: unknown time zone "Mars/Olympus" (zones come from this host's tz database`},
		{"recycle_at never", web + `recycle_at = "0 4 30 2 *"`, 3, `apps.web.recycle_at`, "not a schedule: never comes"},
		{"recycle_at every", web + `recycle_at = "@every 1h"`, 3, `apps.web.recycle_at`, "@every is an interval, not a time of day; write crontab's five fields"},
		{"recycle_at type", web + `recycle_at = 4`, 3, `apps.web.recycle_at = 4`, "want a string"},
		{"recycle_at every after a zone", web + `recycle_at = "CRON_TZ=UTC @every 1s"`, 3, `apps.web.recycle_at`, "@every is an interval, not a time of day"},
		{"recycle_at every second", web + `recycle_at = "* * * * * *"`, 3, `apps.web.recycle_at`, "not a schedule: its times come 1s apart, less than 10s: the pool would never stop being replaced"},
		{"recycle_at empty zone", web + `recycle_at = "CRON_TZ= 0 4 * * *"`, 3, `apps.web.recycle_at`, "not a schedule: CRON_TZ= names no time zone"},
		{"type array", "[apps.web]\ncommand = \"./server\"", 2, "apps.web.command", `want an array of strings; write it like command = ["./server", "-v"]`},
		{"type array elem", "[apps.web]\ncommand = [\"./server\", 1]", 2, "apps.web.command", "want an array of strings"},
		{"type env", web + "env = 5", 3, "apps.web.env = 5", `want a table; write it like env = { MODE = "prod" }`},
		{"type env value", web + `env = { PORT = 8080 }`, 3, "apps.web.env.PORT = 8080", `want a string; write it like PORT = "value"`},
		{"type table", "[apps]\nweb = 5", 2, "apps.web = 5", "want a table; write it like [apps.web]"},
		{"type agent", "agent = 1", 1, "agent = 1", "write it like [agent]"},
		{"type apps", "apps = 1", 1, "apps = 1", "write it like [apps.NAME] tables"},
		{"bom", "\ufeff" + web + "colour = 1", 3, "apps.web.colour", "unknown key"},
		{"type duration int", web + "ready_timeout = 30", 3, "apps.web.ready_timeout = 30", `write it like ready_timeout = "30s"`},
		{"type instances", web + "instances = 1.5", 3, "apps.web.instances = 1.5", `want "max", an integer`},
		{"type size", web + "max_memory = true", 3, "apps.web.max_memory", `want a size like "512MiB"`},
		// durations
		{"bad duration", web + `ready_timeout = "30x"`, 3, `apps.web.ready_timeout = "30x"`, `not a duration; use a number with a unit, e.g. "30s" or "1m30s"`},
		{"negative duration", web + `stop_timeout = "-1s"`, 3, "apps.web.stop_timeout", "must not be negative"},
		{"negative quiet_timeout", web + `quiet_timeout = "-5s"`, 3, "apps.web.quiet_timeout", "must not be negative"},
		{"zero duration", web + `ready_timeout = "0s"`, 3, "apps.web.ready_timeout", `must be more than 0; e.g. ready_timeout = "30s"`},
		{"bad agent duration", "[agent]\nupgrade_timeout = \"soon\"", 2, "agent.upgrade_timeout", "not a duration"},
		{"bad restart duration", web + "[apps.web.restart]\nwindow = \"1 minute\"", 4, "apps.web.restart.window", "not a duration"},
		{"bad max_age", web + "[apps.web.logs]\nmax_age = \"7d\"", 4, "apps.web.logs.max_age", "not a duration"},
		{"max_backoff below backoff", web + "[apps.web.restart]\nbackoff = \"1m\"\nmax_backoff = \"1s\"", 5, "apps.web.restart.max_backoff", "must be at least backoff (1m0s)"},
		// signals
		{"unknown signal", web + `stop_signal = "SIGFOO"`, 3, "apps.web.stop_signal", `unknown signal; use a signal name like "SIGTERM"`},
		{"numeric signal", web + `stop_signal = "15"`, 3, "apps.web.stop_signal", "unknown signal"},
		// numbers
		{"max_surge zero", web + "max_surge = 0", 3, "apps.web.max_surge = 0", "must be at least 1; e.g. max_surge = 1"},
		{"keep_releases one", web + "keep_releases = 1", 3, "apps.web.keep_releases", "must be at least 2"},
		{"negative max_restarts", web + "[apps.web.restart]\nmax_restarts = -1", 4, "apps.web.restart.max_restarts", "must be at least 0"},
		{"max_files zero", web + "[apps.web.logs]\nmax_files = 0", 4, "apps.web.logs.max_files", "must be at least 1"},
		{"huge number", web + "max_surge = 99999999999", 3, "apps.web.max_surge", "too large"},
		{"negative memory", web + "max_memory = -1", 3, "apps.web.max_memory = -1", "must not be negative"},
		{"bad size", web + `max_memory = "12 parsecs"`, 3, "apps.web.max_memory", `not a size; use a number with a unit B, KB, KiB`},
		{"zero log size", web + "[apps.web.logs]\nmax_size = 0", 4, "apps.web.logs.max_size", "must be more than 0"},
		// instances
		{"instances word", web + `instances = "lots"`, 3, `apps.web.instances = "lots"`, `not a worker count; use "max"`},
		{"instances zero", web + "instances = 0", 3, "apps.web.instances = 0", "must be at least 1"},
		{"instances huge", web + "instances = 5000", 3, "apps.web.instances", "at most 1024 workers"},
		{"instances bad negative", web + `instances = "-x"`, 3, "apps.web.instances", "not a worker count"},
		// ready
		{"ready mode", web + `ready = "tcp"`, 3, `apps.web.ready = "tcp"`, `unknown ready mode; use "notify", "node-ipc", "log:REGEX", "delay:DURATION" or "http:PATH"`},
		{"ready regex", web + `ready = "log:([a"`, 3, "apps.web.ready", "bad regex"},
		{"ready empty regex", web + `ready = "log:"`, 3, "apps.web.ready", "empty regex"},
		{"ready delay", web + `ready = "delay:soon"`, 3, "apps.web.ready", `write e.g. "delay:2s"`},
		{"ready arg", web + `ready = "notify:x"`, 3, "apps.web.ready", `takes no argument; write "notify"`},
		// listen
		{"listen scheme", web + `listen = ["http://0.0.0.0:80"]`, 3, "apps.web.listen", `unsupported scheme "http"; use tcp://`},
		{"listen no scheme", web + `listen = ["0.0.0.0:80"]`, 3, "apps.web.listen", "not a listen URL"},
		{"listen no port", web + `listen = ["tcp://0.0.0.0"]`, 3, "apps.web.listen", "missing or bad port"},
		{"listen bad port", web + `listen = ["tcp://:http"]`, 3, "apps.web.listen", `bad port "http"; use a number from 1 to 65535`},
		{"listen big port", web + `listen = ["tcp://:70000"]`, 3, "apps.web.listen", "bad port"},
		{"listen port 0", web + `listen = ["tcp://:0"]`, 3, `apps.web.listen = "tcp://:0"`, "port 0 is not allowed: workers of old and new generations must share one fixed address"},
		{"listen query", web + `listen = ["tcp://:80?x=1"]`, 3, "apps.web.listen", "query strings are not supported"},
		{"listen empty", web + `listen = [""]`, 3, "apps.web.listen", "not a listen URL"},
		{"listen bad name", web + `listen = ["tcp://:80#a:b"]`, 3, "apps.web.listen", "bad name after #"},
		{"listen path", web + `listen = ["tcp://:80/x"]`, 3, "apps.web.listen", "only host:port"},
		{"listen family", web + `listen = ["tcp4://[::1]:80"]`, 3, "apps.web.listen", "does not fit tcp4"},
		{"listen unix empty", web + `listen = ["unix://"]`, 3, "apps.web.listen", "missing socket path"},
		{"listen unix long", web + `listen = ["unix:///` + strings.Repeat("x", 120) + `"]`, 3, "apps.web.listen", "Unix sockets allow 107"},
		// duplicates
		{"dup same app", web + `listen = ["tcp://:80", "tcp://:80"]`, 3, "apps.web.listen", `conflicts with "tcp://:80" of apps.web.listen (`},
		{"dup across apps", web + "listen = [\"tcp://0.0.0.0:80\"]\n[apps.api]\ncommand = [\"./server\"]\nlisten = [\"tcp://127.0.0.1:80\"]", 6, "apps.api.listen", `conflicts with "tcp://0.0.0.0:80" of apps.web.listen (`},
		{"dup unix", web + "listen = [\"unix://a.sock\", \"unix://./a.sock\"]", 3, "apps.web.listen", "an address can be bound only once"},
		{"dup metrics", "[agent]\nmetrics = \"127.0.0.1:9901\"\n" + web + `listen = ["tcp://:9901"]`, 5, "apps.web.listen", "of agent.metrics ("},
		{"dup control socket", "[agent]\nsocket = \"/tmp/d.sock\"\n" + web + `listen = ["unix:///tmp/d.sock"]`, 5, "apps.web.listen", "of agent.socket ("},
		// users and groups
		{"no user", web + `user = "no-such-user-xyz"`, 3, `apps.web.user = "no-such-user-xyz"`, "no such user on this host; create it (useradd) or fix the name"},
		{"no group", web + `group = "no-such-group-xyz"`, 3, "apps.web.group", "no such group on this host; create it (groupadd)"},
		{"no socket group", "[agent]\nsocket_group = \"no-such-group-xyz\"", 2, "agent.socket_group", "no such group"},
		// logs
		{"log format", web + "[apps.web.logs]\nformat = \"xml\"", 4, `apps.web.logs.format = "xml"`, `unknown log format; use "text", "raw", "json" or "pm2-json"`},
		{"log target", web + "[apps.web.logs]\ntarget = \"syslog\"", 4, `apps.web.logs.target = "syslog"`, `unknown log target; use "files" (log_dir), "journal" (the systemd journal) or "both"`},
		// command, cwd, env
		{"no command", "[apps.web]\ncwd = \"srv\"", 1, "apps.web.command", "missing: every app needs the program to run"},
		{"empty command", "[apps.web]\ncommand = []", 2, "apps.web.command", "empty: name the program first"},
		{"command not found", "[apps.web]\ncommand = [\"./nope\"]", 2, "apps.web.command", "./nope: no such file (resolved to /"},
		{"command not executable", "[apps.web]\ncommand = [\"./data.txt\"]", 2, "apps.web.command", "not executable"},
		{"command directory", "[apps.web]\ncommand = [\"srv/\"]", 2, "apps.web.command", "is a directory"},
		{"command not in PATH", "[apps.web]\ncommand = [\"no-such-program-xyz\"]", 2, "apps.web.command", "not found in PATH"},
		{"command absolute missing", "[apps.web]\ncommand = [\"/no/such/bin\"]\nreleases = true", 2, "apps.web.command", "no such file"},
		{"cwd missing", web + `cwd = "nope"`, 3, "apps.web.cwd", "no such directory; create it or fix the path"},
		{"cwd file", web + `cwd = "data.txt"`, 3, "apps.web.cwd", "not a directory"},
		{"env reserved", web + `env = { LISTEN_FDS = "3" }`, 3, "apps.web.env.LISTEN_FDS", "set by the agent for every worker; remove it"},
		{"env reserved notify", web + "[apps.web.env]\nNOTIFY_SOCKET = \"/x\"", 4, "apps.web.env.NOTIFY_SOCKET", "remove it"},
		{"env bad name", web + `env = { "A=B" = "x" }`, 3, `apps.web.env."A=B"`, "bad variable name"},
		{"bad app name", "[apps.\"bad name\"]\ncommand = [\"./server\"]", 1, `apps."bad name"`, "bad app name"},
		// agent
		{"empty path", "[agent]\nstate_dir = \"\"", 2, "agent.state_dir", "must not be empty; remove the line for the default"},
		{"bad metrics", "[agent]\nmetrics = \"9901\"", 2, "agent.metrics", `write e.g. metrics = "127.0.0.1:9901"`},
		{"bad public key", "[agent]\nupgrade_public_key = \"RWQnope\"", 2, "agent.upgrade_public_key", "not a minisign public key"},
		{"long socket", "[agent]\nsocket = \"/" + strings.Repeat("s", 120) + "\"", 2, "agent.socket", "Unix sockets allow 107"},
		// syntax
		{"syntax", web + "cwd = \"srv", 3, `cwd = "srv`, "syntax error: "},
		{"syntax duplicate", web + "command = [\"./server\"]", 3, "syntax error", "apps.web.command is already defined above: remove one of the two"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body)
			_, err := Load(path)
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("want *Error, got %v", err)
			}
			msg := err.Error()
			for _, want := range []string{fmt.Sprintf("%s:%d:", path, tt.line), tt.key, tt.hint} {
				if !strings.Contains(msg, want) {
					t.Errorf("error does not contain %q:\n%s", want, msg)
				}
			}
		})
	}
}

func TestSeveralProblems(t *testing.T) {
	body := web + "ready_timeout = \"30x\"\nmax_surge = 0\ncolour = 1\n[apps.api]\ncommand = [\"./nope\"]\n"
	path := writeConfig(t, body)
	_, err := Load(path)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("want *Error, got %v", err)
	}
	if len(cerr.Problems) != 4 {
		t.Fatalf("want 4 problems, got %d:\n%v", len(cerr.Problems), err)
	}
	lines := []int{3, 4, 5, 7}
	for i, p := range cerr.Problems {
		if p.Line != lines[i] || p.File != path {
			t.Errorf("problem %d at %s:%d, want line %d", i, p.File, p.Line, lines[i])
		}
	}
	if got := strings.Count(err.Error(), "\n"); got != 3 {
		t.Errorf("want one problem per line, got %d newlines", got)
	}
}

func TestSyntaxErrorShowsLine(t *testing.T) {
	path := writeConfig(t, web+"cwd = srv\n")
	_, err := Load(path)
	var cerr *Error
	if !errors.As(err, &cerr) || len(cerr.Problems) != 1 {
		t.Fatalf("want one problem, got %v", err)
	}
	p := cerr.Problems[0]
	if p.Line != 3 || p.Col == 0 {
		t.Errorf("position %d:%d, want line 3 and a column", p.Line, p.Col)
	}
	if !strings.Contains(p.Msg, "    3 | cwd = srv\n") || !strings.Contains(p.Msg, "^") {
		t.Errorf("message does not show the line:\n%s", p.Msg)
	}
	var pe toml.ParseError
	if !errors.As(err, &pe) || pe.Position.Line != 3 {
		t.Errorf("errors.As(toml.ParseError) = %+v", pe)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load("./no-such-dir/deployd.toml")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("want fs.ErrNotExist, got %v", err)
	}
	want := "config file ./no-such-dir/deployd.toml not found; pass -c FILE or set DEPLOYD_CONFIG"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

func TestNoApps(t *testing.T) {
	c := loadOK(t, "# nothing yet\n")
	if len(c.Apps) != 0 || len(c.AppNames) != 0 {
		t.Errorf("apps = %v", c.AppNames)
	}
	if _, ok := c.Apps["web"]; ok {
		t.Error("App(web) found in an empty config")
	}
}

func TestDefaults(t *testing.T) {
	c := loadOK(t, web)
	// The defaults as the configuration docs' table (docs/configuration.md) documents them, written out here
	// rather than taken from defaultApp, so a changed default fails this test.
	dir := filepath.Dir(c.Path)
	want := &App{
		Name:          "web",
		Command:       []string{filepath.Join(dir, "server")},
		Cwd:           dir,
		Instances:     4,
		InstancesSpec: "max",
		Ready:         Ready{Mode: ReadyNotify, Raw: "notify"},
		ReadyTimeout:  30 * time.Second,
		MinReady:      time.Second,
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
			MaxBackoff:  10 * time.Second,
			MaxRestarts: 10,
			Window:      time.Minute,
			StableAfter: time.Second,
		},
		Logs:  Logs{Format: "text", Target: "files", MaxSize: 100 << 20, MaxFiles: 10},
		Node:  "auto",
		Bind:  BindAuto,
		Hooks: Hooks{BeforeTimeout: 5 * time.Minute, AfterTimeout: time.Minute},
	}
	got, ok := c.Apps["web"]
	if !ok {
		t.Fatal("no app web")
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("app\n got %+v\nwant %+v", got, want)
	}
	checks := map[string][2]any{
		"instances":     {got.Instances, 4},
		"spec":          {got.InstancesSpec, "max"},
		"ready":         {got.Ready.Mode, ReadyNotify},
		"ready_timeout": {got.ReadyTimeout, 30 * time.Second},
		"min_ready":     {got.MinReady, time.Second},
		"tcp_nodelay":   {got.TCPNoDelay, true},
		"stop_signal":   {got.StopSignal, syscall.SIGTERM},
		"max_surge":     {got.MaxSurge, 1},
		"keep_releases": {got.KeepReleases, 5},
		"backoff":       {got.Restart.Backoff, 100 * time.Millisecond},
		"window":        {got.Restart.Window, time.Minute},
		"log size":      {got.Logs.MaxSize, int64(100 << 20)},
		"log files":     {got.Logs.MaxFiles, 10},
		"log format":    {got.Logs.Format, "text"},
		"names":         {fmt.Sprint(c.AppNames), "[web]"},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %v, want %v", name, c[0], c[1])
		}
	}
}

func TestAgentDefaults(t *testing.T) {
	tests := []struct {
		name string
		env  hostEnv
		want Agent
	}{
		{"root", fakeEnv(0), Agent{Socket: "/run/deployd/deployd.sock", StateDir: "/var/lib/deployd", LogDir: "/var/log/deployd", UpgradeTimeout: time.Minute, StreamTimeout: 30 * time.Second}},
		{"user", fakeEnv(1000), Agent{Socket: "/run/user/1000/deployd.sock", StateDir: "/home/ann/.local/state/deployd", LogDir: "/home/ann/.local/state/deployd/logs", UpgradeTimeout: time.Minute, StreamTimeout: 30 * time.Second}},
	}
	xdg := fakeEnv(1000)
	xdg.getenv = func(k string) string { return map[string]string{"XDG_STATE_HOME": "/st"}[k] }
	tests = append(tests, struct {
		name string
		env  hostEnv
		want Agent
	}{"xdg", xdg, Agent{Socket: "/run/deployd/deployd.sock", StateDir: "/st/deployd", LogDir: "/st/deployd/logs", UpgradeTimeout: time.Minute, StreamTimeout: 30 * time.Second}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse("/etc/deployd.toml", nil, tt.env)
			must(t, err)
			if c.Agent != tt.want {
				t.Errorf("got  %+v\nwant %+v", c.Agent, tt.want)
			}
		})
	}
}

func TestRelativePaths(t *testing.T) {
	body := `[agent]
socket = "run/d.sock"
state_dir = "state"
log_dir = "../logs"
pid_file = "d.pid"
[apps.web]
command = ["./server", "x"]
cwd = "srv"
listen = ["unix://web.sock", "unix:///abs/web.sock"]
[apps.rel]
command = ["bin/server"]
releases = true
[apps.sh]
command = ["sh", "-c", "true"]
`
	c := loadOK(t, body)
	dir := filepath.Dir(c.Path)
	web, rel, sh := c.Apps["web"], c.Apps["rel"], c.Apps["sh"]
	checks := map[string][2]string{
		"socket":  {c.Agent.Socket, dir + "/run/d.sock"},
		"state":   {c.Agent.StateDir, dir + "/state"},
		"logs":    {c.Agent.LogDir, filepath.Dir(dir) + "/logs"},
		"pid":     {c.Agent.PIDFile, dir + "/d.pid"},
		"command": {web.Command[0], dir + "/server"},
		"argv1":   {web.Command[1], "x"},
		"cwd":     {web.Cwd, dir + "/srv"},
		"unix":    {web.Listen[0].Address, dir + "/web.sock"},
		"abs":     {web.Listen[1].Address, "/abs/web.sock"},
		"release": {rel.Command[0], "bin/server"},
		"rel cwd": {rel.Cwd, dir},
		"path":    {fmt.Sprint(filepath.IsAbs(sh.Command[0])), "true"},
		"sh name": {filepath.Base(sh.Command[0]), "sh"},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %q, want %q", name, c[0], c[1])
		}
	}
}

func TestFullConfig(t *testing.T) {
	body := web + `env = { MODE = "prod", A = "x=y" }
instances = 2
listen = ["tcp://0.0.0.0:8080", "tcp://127.0.0.1:9000#admin"]
ready = "log:listening on (\\d+)"
stop_signal = "quit"
nonblocking = true
max_memory = "512MiB"
cpu_affinity = true
user = "root"
group = "0"
watchdog = "10s"
canary_timeout = "15m"
canary_action = "promote"
[apps.web.restart]
backoff = "1s"
max_restarts = 0
[apps.web.logs]
format = "json"
target = "both"
max_size = "1.5KB"
max_age = "168h"
compress = true
`
	a := loadOK(t, body).Apps["web"]
	got := fmt.Sprintln(a.Env, a.Instances, a.Listen[1].Name, a.Listen[0].Name, a.Ready.Mode,
		a.Ready.Regex.MatchString("listening on 80"), a.StopSignal == syscall.SIGQUIT, a.Nonblocking,
		a.MaxMemory, a.CPUAffinity, a.User, a.Group, a.Watchdog, a.Restart.Backoff,
		a.Restart.MaxRestarts, a.Logs, a.CanaryTimeout, a.CanaryAction)
	want := "[A=x=y MODE=prod] 2 admin web log true true true 536870912 true root 0 10s 1s 0 {json both 1500 10 168h0m0s true} 15m0s promote\n"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestFind(t *testing.T) {
	t.Setenv("DEPLOYD_CONFIG", "")
	if got := Find(""); got != "./deployd.toml" {
		t.Errorf("Find() = %q", got)
	}
	t.Setenv("DEPLOYD_CONFIG", "/etc/d.toml")
	if got := Find(""); got != "/etc/d.toml" {
		t.Errorf("Find() with env = %q", got)
	}
	if got := Find("my.toml"); got != "my.toml" {
		t.Errorf("Find(flag) = %q", got)
	}
}

func TestDefaultSocket(t *testing.T) {
	env := fakeEnv(1000)
	if got := env.socket(); got != "/run/user/1000/deployd.sock" {
		t.Errorf("user socket = %q", got)
	}
	env.getenv = func(string) string { return "" }
	if got := env.socket(); got != rootSocket {
		t.Errorf("socket without XDG_RUNTIME_DIR = %q", got)
	}
	if got := fakeEnv(0).socket(); got != rootSocket {
		t.Errorf("root socket = %q", got)
	}
	if got := DefaultSocket(); !filepath.IsAbs(got) {
		t.Errorf("DefaultSocket() = %q", got)
	}
}

// TestRecycleAt: the forms recycle_at takes, and what a schedule means:
// its first time after a worker's start.
func TestRecycleAt(t *testing.T) {
	start := time.Date(2026, 12, 3, 1, 30, 0, 0, time.UTC)
	for _, c := range []struct{ in, next string }{
		{"0 4 * * *", "2026-12-03T04:00:00Z"},
		{"  30 3 * * MON ", "2026-12-07T03:30:00Z"}, // 2026-12-03 is a Thursday
		{"*/15 * * * * *", "2026-12-03T01:30:15Z"},  // seconds first, as PM2's cron_restart
		{"@daily", "2026-12-04T00:00:00Z"},
		{"CRON_TZ=Europe/Berlin 0 4 * * *", "2026-12-03T03:00:00Z"},
		{"TZ=UTC\t0 4 * * *", "2026-12-03T04:00:00Z"}, // a tab after the zone // 04:00 in Berlin (UTC+1), 02:30 there at the start
	} {
		a := loadOK(t, web+fmt.Sprintf("recycle_at = %q\n", c.in)).Apps["web"]
		if a.RecycleAt != strings.TrimSpace(c.in) {
			t.Errorf("%q: RecycleAt %q", c.in, a.RecycleAt)
		}
		sched, err := ParseRecycleAt(a.RecycleAt)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if got := sched.Next(start).UTC().Format(time.RFC3339); got != c.next {
			t.Errorf("%q: first time after %s is %s, want %s", c.in, start.Format(time.RFC3339), got, c.next)
		}
	}
	if a := loadOK(t, web+`recycle_at = ""`).Apps["web"]; a.RecycleAt != "" {
		t.Errorf(`recycle_at = "" is off, got %q`, a.RecycleAt)
	}
}

// quiet_timeout = "0s" turns the quiet phase off (a zero the other
// timeouts refuse).
func TestQuietTimeoutZeroTurnsItOff(t *testing.T) {
	c := loadOK(t, web+`quiet_timeout = "0s"`)
	if got := c.Apps["web"].QuietTimeout; got != 0 {
		t.Fatalf("quiet_timeout = %v, want 0", got)
	}
}
