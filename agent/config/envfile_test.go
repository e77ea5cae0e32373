package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestEnvFileAndInherit(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "web.env")
	must(t, os.WriteFile(secrets, []byte("# the database\n\nexport DATABASE_URL = \"postgres://u:p@db/web\"\r\n"+
		"API_KEY='k=1'\nEMPTY=\nAPI_KEY=k2\n"), 0o600))
	c := loadOK(t, web+`env = { MODE = "prod" }
env_file = "`+secrets+`"
env_inherit = ["HTTP_PROXY", "NO_PROXY", "HTTP_PROXY"]
`)
	app := c.Apps["web"]
	if want := []string{"API_KEY=k2", "DATABASE_URL=postgres://u:p@db/web", "EMPTY=", "MODE=prod"}; !slices.Equal(app.Env, want) {
		t.Errorf("Env = %q, want %q", app.Env, want)
	}
	if app.EnvFile != secrets {
		t.Errorf("EnvFile = %q, want %q", app.EnvFile, secrets)
	}
	if want := []string{"HTTP_PROXY", "NO_PROXY"}; !slices.Equal(app.EnvInherit, want) {
		t.Errorf("EnvInherit = %q, want %q", app.EnvInherit, want)
	}
}

// An env_file another user could write, or one that is not a plain file,
// is refused with what to do; no message shows the file's contents.
func TestEnvFileRefused(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		must(t, os.WriteFile(p, []byte(body), mode))
		must(t, os.Chmod(p, mode)) // past the umask
		return p
	}
	ok := file("ok.env", "TOKEN=hunter2\n", 0o600)
	link := filepath.Join(dir, "link.env")
	must(t, os.Symlink(ok, link))
	fifo := filepath.Join(dir, "fifo.env")
	must(t, syscall.Mkfifo(fifo, 0o600))
	big := file("big.env", "A="+strings.Repeat("x", MaxEnvFile)+"\n", 0o600)
	for _, tc := range []struct{ name, path, hint string }{
		{"world-writable", file("ww.env", "TOKEN=hunter2\n", 0o606), "group- or world-writable (mode 0606)"},
		{"group-writable", file("gw.env", "TOKEN=hunter2\n", 0o660), "chmod go-w"},
		{"symlink", link, "is a symbolic link"},
		{"fifo", fifo, "not a regular file"},
		{"missing", filepath.Join(dir, "none.env"), "cannot open the env_file"},
		{"too big", big, "more than the 1048576 bytes"},
		{"no equals", file("noeq.env", "# c\nhunter2\n", 0o600), "line 2: not NAME=value"},
		{"reserved", file("res.env", "LISTEN_FDS=hunter2\n", 0o600), "line 1: bad variable name"},
		{"both", file("both.env", "MODE=hunter2\n", 0o600), "MODE is set both in env and in the env_file"},
	} {
		body := web + "env = { MODE = \"prod\" }\nenv_file = \"" + tc.path + "\"\n"
		path := writeConfig(t, body)
		_, err := parse(path, []byte(body), fakeEnv(1000))
		if err == nil || !strings.Contains(err.Error(), tc.hint) || !strings.Contains(err.Error(), "apps.web.env_file") {
			t.Errorf("%s: parse error\n%v\nwant one about apps.web.env_file saying %q", tc.name, err, tc.hint)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the file's contents: %v", tc.name, err)
		}
	}
	if os.Geteuid() == 0 {
		other := file("other.env", "TOKEN=hunter2\n", 0o600)
		must(t, os.Chown(other, 1234, 0))
		body := web + "env_file = \"" + other + "\"\n"
		if _, err := parse(writeConfig(t, body), []byte(body), fakeEnv(1000)); err == nil ||
			!strings.Contains(err.Error(), "owned by uid 1234; it must be owned by root or by the agent's user (uid 1000)") {
			t.Errorf("env_file of another user: %v", err)
		}
	}
}

func TestEnvInheritRefused(t *testing.T) {
	for _, name := range []string{"NOTIFY_SOCKET", "LISTEN_FDS", "DEPLOYD_SOCKET", "TABLEFLIP_X", "WATCHDOG_PID", "A=B", ""} {
		body := web + "env_inherit = [\"" + name + "\"]\n"
		if _, err := parse(writeConfig(t, body), []byte(body), fakeEnv(1000)); err == nil || !strings.Contains(err.Error(), "apps.web.env_inherit") {
			t.Errorf("env_inherit = [%q]: %v, want a problem", name, err)
		}
	}
}
