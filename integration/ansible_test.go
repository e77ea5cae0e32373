package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fleetHost is one "host" of the Ansible tests: an agent with its own
// folder, socket, state, config and port, reached with ansible_connection:
// local.
type fleetHost struct {
	name  string
	agent *Agent
	port  int
	// configGID is the group the role gives the config: the socket_group's
	// (host2 has one where the group "daemon" exists), else root's.
	configGID int
}

// fleet runs ansible-playbook with deploy/ansible's playbooks against hosts.
type fleet struct {
	t         *testing.T
	playbook  string // the ansible-playbook binary
	inventory string
	env       []string
	hosts     []*fleetHost
	order     string // the file the hooks append "start HOST" / "end HOST" to
}

// newFleet prepares n hosts (no agent runs yet) and their inventory: the
// role's variables for each, the systemd service left out (no systemd here),
// its units written into the host's folder.
func newFleet(t *testing.T, n int) *fleet {
	t.Helper()
	playbook, err := exec.LookPath("ansible-playbook")
	if err != nil {
		skipOrFail(t, "ansible-playbook not found (Debian package ansible-core; .ci/run installs it): "+err.Error())
	}
	home := t.TempDir()
	cfg := filepath.Join(home, "ansible.cfg") // so that no ansible.cfg of the caller applies
	if err := os.WriteFile(cfg, []byte("[defaults]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, playbook: playbook, inventory: filepath.Join(home, "inventory.yml"),
		order: filepath.Join(home, "order.log"),
		env: CleanEnv("ANSIBLE_CONFIG="+cfg, "ANSIBLE_HOME="+home, "ANSIBLE_LOCAL_TEMP="+filepath.Join(home, "tmp"),
			"ANSIBLE_REMOTE_TEMP="+filepath.Join(home, "rtmp"), "ANSIBLE_NOCOLOR=1", "ANSIBLE_PIPELINING=1",
			"ANSIBLE_RETRY_FILES_ENABLED=0", "ANSIBLE_FORKS=5", "ANSIBLE_DEPRECATION_WARNINGS=0")}
	hosts := map[string]any{}
	for i := 1; i <= n; i++ {
		a := NewAgentDir(t, bins, "")
		a.Binary = filepath.Join(a.Dir, "deployd") // installed by the role
		h := &fleetHost{name: fmt.Sprintf("host%d", i), agent: a, port: FreePort(t)}
		if err := os.Mkdir(filepath.Join(a.Dir, "units"), 0o755); err != nil { // /etc/systemd/system on a host
			t.Fatal(err)
		}
		f.hosts = append(f.hosts, h)
		socketGroup := ""
		if g, err := user.LookupGroup("daemon"); err == nil && i == 2 {
			socketGroup = g.Name
			h.configGID, _ = strconv.Atoi(g.Gid)
		}
		hosts[h.name] = map[string]any{
			"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
			"deployd_binary_path": a.Binary, "deployd_config_path": a.Config,
			"deployd_socket": a.Socket, "deployd_socket_group": socketGroup, "deployd_state_dir": filepath.Join(a.Dir, "state"),
			"deployd_log_dir": filepath.Join(a.Dir, "logs"), "deployd_unit_dir": filepath.Join(a.Dir, "units"),
			"deployd_release_dir": filepath.Join(a.Dir, "artifacts"), "deployd_manage_service": false,
			"deployd_apps": map[string]any{"web": map[string]any{
				"command": []string{"./run"}, "releases": true, "instances": 2,
				"listen": []string{fmt.Sprintf("tcp://127.0.0.1:%d", h.port)}, "ready_timeout": "5s",
				"stop_timeout": "10s", "env": map[string]string{"FLEET_HOST": h.name},
				"hooks": map[string]string{
					"before": fmt.Sprintf(`echo "start $FLEET_HOST $DEPLOYD_RELEASE" >> %s`, f.order),
					"after":  fmt.Sprintf(`echo "end $FLEET_HOST $DEPLOYD_RELEASE" >> %s`, f.order),
				},
			}},
		}
	}
	inv, _ := json.Marshal(map[string]any{"web": map[string]any{"hosts": hosts}}) // JSON is YAML
	if err := os.WriteFile(f.inventory, inv, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// run runs one of deploy/ansible's playbooks with extra vars (k=v; an
// argument starting with "-" is passed as is) and returns its exit code, its
// output and the changed count of each host in the recap (-1: not in the
// recap).
func (f *fleet) run(play string, vars ...string) (int, string, map[string]int) {
	f.t.Helper()
	args := []string{"-i", f.inventory, play}
	for _, v := range vars {
		if strings.HasPrefix(v, "-") {
			args = append(args, v)
		} else {
			args = append(args, "-e", v)
		}
	}
	cmd := exec.Command(f.playbook, args...)
	cmd.Dir = filepath.Join(RepoRoot(), "deploy", "ansible")
	cmd.Env = f.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	var cpu time.Duration
	if cmd.ProcessState != nil {
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	f.t.Logf("ansible-playbook %s: %v in %s (cpu %s)", play, err, time.Since(t0).Round(time.Millisecond), cpu.Round(time.Millisecond))
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		f.t.Fatalf("run ansible-playbook: %v", err)
	}
	changed := map[string]int{}
	for _, h := range f.hosts {
		changed[h.name] = -1
		re := regexp.MustCompile(`(?m)^` + h.name + `\s+: ok=\d+\s+changed=(\d+)`)
		if m := re.FindStringSubmatch(out.String()); m != nil {
			changed[h.name], _ = strconv.Atoi(m[1])
		}
	}
	return code, out.String(), changed
}

// fleetTarball packs artifactDir(version, broken) as web-VERSION.tar.gz.
func fleetTarball(t *testing.T, version string, broken bool) (path, sum string) {
	t.Helper()
	dir := artifactDir(t, version, broken)
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, name := range []string{"run", "server"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(b))})
		tw.Write(b)
	}
	tw.Close()
	gz.Close()
	path = filepath.Join(t.TempDir(), "web-"+version+".tar.gz")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(buf.Bytes())
	return path, hex.EncodeToString(s[:])
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// requireFleet checks that every host serves want, worker by worker.
func (f *fleet) requireFleet(what string, want ...string) {
	f.t.Helper()
	for i, h := range f.hosts {
		app := h.agent.App("web")
		if app.Release != want[i] {
			f.t.Errorf("%s: %s runs release %q, want %q", what, h.name, app.Release, want[i])
		}
		for pid, v := range identities(f.t, h.port, PIDs(app)) {
			if v != want[i] {
				f.t.Errorf("%s: %s worker %d serves %s, want %s", what, h.name, pid, v, want[i])
			}
		}
	}
}

// requireOwned checks path's owner, group and permission bits.
func requireOwned(t *testing.T, what, path string, uid, gid int, perm os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid || fi.Mode().Perm() != perm {
		t.Errorf("%s %s: owner %d:%d mode %04o, want %d:%d %04o", what, path, st.Uid, st.Gid, fi.Mode().Perm(), uid, gid, perm)
	}
}

// requireChanged checks each host's changed count in a play's recap.
func (f *fleet) requireChanged(what string, changed map[string]int, want func(host string, n int) bool, out string) {
	f.t.Helper()
	for _, h := range f.hosts {
		if !want(h.name, changed[h.name]) {
			f.t.Errorf("%s: %s changed=%d (-1: not in the recap)\n%s", what, h.name, changed[h.name], tailOf(out, 40))
		}
	}
}

// The role installs three agents, rolls a release across them one host at
// a time, stops at the first host where a release fails readiness, rolls
// back, changes nothing on a second run, and upgrades the agents in place.
func TestAnsibleFleet(t *testing.T) {
	parallelFirst(t) // see parallel.go
	f := newFleet(t, 3)
	sum1 := fileSHA256(t, bins.Deployd)
	install := []string{"deployd_binary_src=" + bins.Deployd, "deployd_binary_sha256=" + sum1, "deployd_serial=3"}

	// Install: binary (sha256 checked), config, units; then the agents start
	// (systemd would start them; there is none here).
	if code, out, changed := f.run("install.yml", install...); code != 0 {
		t.Fatalf("install: exit %d\n%s", code, out)
	} else {
		f.requireChanged("install", changed, func(_ string, n int) bool { return n >= 3 }, out)
	}
	for _, h := range f.hosts {
		if got := fileSHA256(t, h.agent.Binary); got != sum1 {
			t.Errorf("%s: installed binary sha256 %s, want %s", h.name, got, sum1)
		}
		unit, err := os.ReadFile(filepath.Join(h.agent.Dir, "units", "deployd.service"))
		if err != nil || !strings.Contains(string(unit), "ExecStart="+h.agent.Binary+" agent -c "+h.agent.Config) {
			t.Errorf("%s: unit from `deployd startup systemd`: %v\n%s", h.name, err, unit)
		}
		ref := t.TempDir()
		if out, err := exec.Command(h.agent.Binary, "startup", "systemd", "-c", h.agent.Config, "--unit-dir", ref).CombinedOutput(); err != nil {
			t.Fatalf("deployd startup systemd: %v\n%s", err, out)
		}
		if want, _ := os.ReadFile(filepath.Join(ref, "deployd.service")); string(want) != string(unit) {
			t.Errorf("%s: the role's unit differs from what `deployd startup systemd` writes:\n%s\nwant:\n%s", h.name, unit, want)
		}
		// The config holds the apps' env: root's, readable by the
		// socket_group alone; its folder root's.
		requireOwned(t, h.name+": config", h.agent.Config, 0, h.configGID, 0o640)
		requireOwned(t, h.name+": config folder", filepath.Dir(h.agent.Config), 0, 0, 0o755)
		requireOwned(t, h.name+": unit", filepath.Join(h.agent.Dir, "units", "deployd.service"), 0, 0, 0o644)
		requireOwned(t, h.name+": binary", h.agent.Binary, 0, 0, 0o755)
		h.agent.Start()
		if r := h.agent.CLI("deploy", "web", "--artifact", artifactDir(t, "1.0.0", false), "--version", "1.0.0"); r.Code != 0 {
			t.Fatalf("%s: deploy 1.0.0: exit %d\n%s", h.name, r.Code, r.Stderr)
		}
	}
	os.Remove(f.order)

	// A local user made host1's artifacts folder first, open to all: the
	// role makes it root's alone.
	squat := filepath.Join(f.hosts[0].agent.Dir, "artifacts")
	if err := os.Mkdir(squat, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(squat, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(squat, 65534, 65534); err != nil {
		t.Fatal(err)
	}

	// A good release reaches every host, one at a time.
	art2, sum2 := fleetTarball(t, "2.0.0", false)
	deploy2 := []string{"deployd_app=web", "deployd_release_artifact=" + art2, "deployd_release_version=2.0.0", "deployd_release_sha256=" + sum2}
	code, out, changed := f.run("deploy.yml", deploy2...)
	if code != 0 {
		t.Fatalf("deploy 2.0.0: exit %d\n%s", code, out)
	}
	f.requireChanged("deploy 2.0.0", changed, func(_ string, n int) bool { return n >= 1 }, out)
	f.requireFleet("after deploy 2.0.0", "2.0.0", "2.0.0", "2.0.0")
	for _, h := range f.hosts {
		dir := filepath.Join(h.agent.Dir, "artifacts")
		requireOwned(t, h.name+": artifacts folder", dir, 0, 0, 0o700)
		requireOwned(t, h.name+": shipped artifact", filepath.Join(dir, filepath.Base(art2)), 0, 0, 0o644)
	}
	order, _ := os.ReadFile(f.order)
	want := "start host1 2.0.0\nend host1 2.0.0\nstart host2 2.0.0\nend host2 2.0.0\nstart host3 2.0.0\nend host3 2.0.0\n"
	if string(order) != want {
		t.Errorf("the hosts' deploys (before and after hooks) ran in this order:\n%s\nwant one host at a time:\n%s", order, want)
	}

	// The same play again changes nothing.
	code, out, changed = f.run("deploy.yml", deploy2...)
	if code != 0 {
		t.Fatalf("deploy 2.0.0 again: exit %d\n%s", code, out)
	}
	f.requireChanged("deploy 2.0.0 again", changed, func(_ string, n int) bool { return n == 0 }, out)

	// A release that fails readiness on the first host stops the play there.
	art3, sum3 := fleetTarball(t, "3.0.0", true)
	code, out, changed = f.run("deploy.yml", "deployd_app=web", "deployd_release_artifact="+art3,
		"deployd_release_version=3.0.0", "deployd_release_sha256="+sum3)
	if code == 0 || !strings.Contains(out, "web deploy of 3.0.0 failed") || !strings.Contains(out, "missing DATABASE_URL") {
		t.Errorf("deploy of a broken release: exit %d, want a failure with the agent's reason\n%s", code, out)
	}
	for _, h := range f.hosts[1:] {
		if changed[h.name] > 0 {
			t.Errorf("the failed play changed %s", h.name)
		}
		if _, err := os.Stat(filepath.Join(h.agent.Dir, "artifacts", "web-3.0.0.tar.gz")); err == nil {
			t.Errorf("the failed play went on to %s (the artifact was shipped there)", h.name)
		}
	}
	f.requireFleet("after the failed deploy", "2.0.0", "2.0.0", "2.0.0")

	// The rollback play, twice: the second run changes nothing.
	code, out, changed = f.run("rollback.yml", "deployd_app=web", "deployd_rollback_to=1.0.0")
	if code != 0 {
		t.Fatalf("rollback: exit %d\n%s", code, out)
	}
	f.requireChanged("rollback", changed, func(_ string, n int) bool { return n == 1 }, out)
	f.requireFleet("after the rollback", "1.0.0", "1.0.0", "1.0.0")
	code, out, changed = f.run("rollback.yml", "deployd_app=web", "deployd_rollback_to=1.0.0")
	if code != 0 {
		t.Fatalf("rollback again: exit %d\n%s", code, out)
	}
	f.requireChanged("rollback again", changed, func(_ string, n int) bool { return n == 0 }, out)

	// A new binary (the binary's tasks only): each agent upgrades in place,
	// its workers keep running.
	workers := map[string]map[int]int{}
	agents := map[string]int{}
	for _, h := range f.hosts {
		workers[h.name], agents[h.name] = PIDs(h.agent.App("web")), h.agent.Status().Agent.PID
	}
	sum2bin := fileSHA256(t, bins.DeploydV2)
	code, out, changed = f.run("install.yml", "--tags=deployd_binary", "deployd_binary_src="+bins.DeploydV2, "deployd_binary_sha256="+sum2bin, "deployd_serial=3")
	if code != 0 {
		t.Fatalf("install a new binary: exit %d\n%s", code, out)
	}
	f.requireChanged("install a new binary", changed, func(_ string, n int) bool { return n >= 1 }, out)
	for _, h := range f.hosts {
		st := h.agent.Status()
		if st.Agent.PID == agents[h.name] || st.Agent.Version != "test-2" {
			t.Errorf("%s: after the upgrade the agent is pid %d version %s (was pid %d)", h.name, st.Agent.PID, st.Agent.Version, agents[h.name])
		}
		if got := PIDs(appOf(st, "web")); fmt.Sprint(got) != fmt.Sprint(workers[h.name]) {
			t.Errorf("%s: the upgrade changed the workers: %v -> %v", h.name, workers[h.name], got)
		}
		if got := fileSHA256(t, h.agent.Binary); got != sum2bin {
			t.Errorf("%s: binary sha256 %s after the upgrade, want %s", h.name, got, sum2bin)
		}
	}
	f.requireFleet("after the agent upgrade", "1.0.0", "1.0.0", "1.0.0")
}
