package config

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deployd/deployd/internal/safeopen"
)

// An env_file whose folder is a link (an app user swapped the folder it
// owns for a link into a root-only one) is not read through the link.
func TestEnvFileThroughLinkedFolderRefused(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "root-only")
	must(t, os.Mkdir(secret, 0o700))
	must(t, os.WriteFile(filepath.Join(secret, "web.env"), []byte("TOKEN=hunter2\n"), 0o600))
	must(t, os.Symlink(secret, filepath.Join(dir, "app")))
	body := web + "env_file = \"" + filepath.Join(dir, "app", "web.env") + "\"\n"
	c, err := parse(writeConfig(t, body), []byte(body), fakeEnv(1000))
	if err == nil {
		t.Fatalf("read an env_file through a linked folder: Env %q", c.Apps["web"].Env)
	}
	for _, want := range []string{"apps.web.env_file", "is a symbolic link", "real path"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the error shows the file's contents: %v", err)
	}
}

// A log_dir, state_dir, env_file or unix listener folder that a user other
// than root can write is refused, naming the folder, its owner and mode,
// and the fix; a folder under /tmp (sticky) that root owns is fine.
func TestFoldersOthersCanWriteRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives a folder to another user")
	}
	base := t.TempDir()
	user := filepath.Join(base, "user")
	must(t, os.Mkdir(user, 0o755))
	must(t, os.Chown(user, 4242, 4242))
	must(t, os.WriteFile(filepath.Join(base, "web.env"), []byte("A=1\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(user, "web.env"), []byte("A=1\n"), 0o600))
	env := fakeEnv(0)
	env.checkFolder = safeopen.Trust.CheckFolder
	load := func(agent, app string) error {
		body := "[agent]\n" + agent + "\n" + web + app
		_, err := parse(writeConfig(t, body), []byte(body), env)
		return err
	}
	good := "state_dir = \"" + base + "/state\"\nlog_dir = \"" + base + "/logs\"\n"
	if err := load(good, "env_file = \""+base+"/web.env\"\nlisten = [\"unix://"+base+"/web.sock\"]\n"); err != nil {
		t.Fatalf("root's folders under /tmp: %v", err)
	}
	for _, tc := range []struct{ name, agent, app, key string }{
		{"log_dir", "state_dir = \"" + base + "/state\"\nlog_dir = \"" + user + "/logs\"\n", "", "agent.log_dir"},
		{"state_dir", "state_dir = \"" + user + "\"\n", "", "agent.state_dir"},
		{"env_file", good, "env_file = \"" + user + "/web.env\"\n", "apps.web.env_file"},
		{"unix listen", good, "listen = [\"unix://" + user + "/web.sock\"]\n", "apps.web.listen"},
	} {
		err := load(tc.agent, tc.app)
		for _, want := range []string{tc.key, "folder " + user + " (owner uid 4242", "mode drwxr-xr-x (0755)", "chown root " + user, "chmod go-w", "only root can write"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error lacks %q:\n%v", tc.name, want, err)
			}
		}
	}
}

// A log_dir folder its group can write is refused when socket_group or an
// app's user is in that group, and fine otherwise (Ubuntu's /var/log is
// root:syslog 0775).
func TestFoldersGroupWritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives a folder to another group")
	}
	if _, err := user.LookupGroupId("1"); err != nil {
		t.Skipf("needs group 1 (daemon): %v", err)
	}
	base := t.TempDir()
	shared := filepath.Join(base, "shared")
	must(t, os.Mkdir(shared, 0o775))
	must(t, os.Chmod(shared, 0o775))
	must(t, os.Chown(shared, 0, 1))
	env := fakeEnv(0)
	env.checkFolder = safeopen.Trust.CheckFolder
	agent := "[agent]\nstate_dir = \"" + base + "/state\"\nlog_dir = \"" + shared + "/logs\"\n"
	for _, tc := range []struct{ name, body, want string }{
		{"no app or member in it", agent + web, ""},
		{"socket_group", strings.Replace(agent, "[agent]\n", "[agent]\nsocket_group = \"1\"\n", 1) + web, "writable by its group, gid 1, socket_group"},
		{"app's user", agent + web + "user = \"1\"\n", "writable by its group, gid 1, a group of app web's user"},
	} {
		_, err := parse(writeConfig(t, tc.body), []byte(tc.body), env)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "chmod g-w "+shared)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.want)
		}
	}
}
