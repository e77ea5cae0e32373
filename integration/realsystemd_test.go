package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/syncbuf"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/failpoint"
)

// A real systemd for the tests: systemd (252 here) booted as PID 1 of its
// own PID, mount and cgroup namespaces, chrooted into an overlay of the
// machine's root whose upper layer is a tmpfs, with /proc, /sys, /dev and a
// private /run mounted in. The test's folders are bind-mounted at their own
// paths, so the control socket, the config and the logs are the same files
// inside and out; the network namespace is shared, so the test's load
// reaches the units on loopback. Nothing is written to the machine's root
// (systemd-tmpfiles, run at boot, cleans /tmp of the overlay only), and the
// namespaces and their mounts go when systemd is killed.
//
// systemctl runs inside with nsenter. Pids that the agent reports (status)
// are pids of the namespace; the harness turns them into the machine's when
// it needs to (hostPID).

// realSystemd is one booted systemd.
type realSystemd struct {
	t      testing.TB
	pid    int    // systemd's pid as the machine sees it
	cgroup string // the name of the cgroup subtree it runs in
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
}

// bootScript boots systemd: $1 the tmpfs folder, $2 the cgroup name, then
// the folders to bind-mount at their own paths.
const bootScript = `set -eu
T=$1; CG=$2; shift 2
for h in systemd unified; do
	mkdir -p /sys/fs/cgroup/$h/$CG
	echo $$ > /sys/fs/cgroup/$h/$CG/cgroup.procs
done
exec unshare --pid --fork --mount --cgroup --propagation private --uts --ipc -- sh -euc '
T=$1; shift
mount -t tmpfs tmpfs $T
mkdir -p $T/upper $T/work $T/root
mount -t overlay overlay -o lowerdir=/,upperdir=$T/upper,workdir=$T/work $T/root
mount -t proc proc $T/root/proc
mount --rbind /sys $T/root/sys
mount -t tmpfs -o mode=755 tmpfs $T/root/sys/fs/cgroup
mkdir $T/root/sys/fs/cgroup/systemd $T/root/sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd,xattr cgroup $T/root/sys/fs/cgroup/systemd
mount -t cgroup2 cgroup2 $T/root/sys/fs/cgroup/unified
mount --rbind /dev $T/root/dev
mount -t tmpfs tmpfs $T/root/run
for d in "$@"; do mkdir -p $T/root$d; mount --bind $d $T/root$d; done
export container=deployd-test
exec chroot $T/root /lib/systemd/systemd --system --unit=basic.target
' boot "$T" "$@"
`

// bootSystemd boots a systemd that sees dirs at their own paths, and waits
// until it runs. It fails the test where that cannot be done, and under
// CI=true a missing systemd is a failure, not a skip.
func bootSystemd(t testing.TB, dirs ...string) *realSystemd {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "a real systemd needs root (namespaces, mounts)")
	}
	if _, err := os.Stat("/lib/systemd/systemd"); err != nil {
		skipOrFail(t, "systemd is not installed (apt-get install systemd)")
	}
	for _, tool := range []string{"unshare", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, tool+" is not installed (util-linux)")
		}
	}
	tmp, err := os.MkdirTemp("", "deployd-systemd-")
	if err != nil {
		t.Fatal(err)
	}
	s := &realSystemd{t: t, cgroup: "deployd-systemd-test-" + filepath.Base(tmp), out: &syncbuf.Buffer{}}
	s.cmd = exec.Command("sh", append([]string{"-c", bootScript, "boot", tmp, s.cgroup}, dirs...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { s.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		s.stop(exited)
		os.Remove(tmp)
	})
	// unshare's child is systemd: it is the only process of the cgroup
	// that is not unshare itself once the boot script exec'd.
	deadline := time.Now().Add(30 * time.Second)
	for s.pid == 0 {
		select {
		case <-exited:
			t.Fatalf("systemd did not boot:\n%s", s.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd did not start within 30 s:\n%s", s.out.String())
		}
		s.pid = s.systemdPID()
		time.Sleep(20 * time.Millisecond)
	}
	var state string
	for {
		out, _ := s.ctl("is-system-running")
		state = strings.TrimSpace(out)
		if state == "running" || state == "degraded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd is %q 30 s after its start:\n%s", state, s.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("systemd booted as pid %d (%s)", s.pid, state)
	return s
}

// systemdPID finds the systemd of this boot among the processes of its
// cgroup (0 until it runs).
func (s *realSystemd) systemdPID() int {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/systemd", s.cgroup, "init.scope", "cgroup.procs"))
	if err != nil {
		b, _ = os.ReadFile(filepath.Join("/sys/fs/cgroup/systemd", s.cgroup, "cgroup.procs"))
	}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "systemd" {
			return pid
		}
	}
	return 0
}

// stop kills the namespace's PID 1 (the kernel then kills every process
// of the namespace and its mounts go with it) and removes the cgroups.
func (s *realSystemd) stop(exited <-chan struct{}) {
	if s.pid > 0 {
		_ = syscall.Kill(s.pid, syscall.SIGKILL)
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		s.t.Errorf("the systemd namespace did not end within 30 s")
	}
	for _, h := range []string{"systemd", "unified"} {
		root := filepath.Join("/sys/fs/cgroup", h, s.cgroup)
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- { // deepest first
			deadline := time.Now().Add(10 * time.Second)
			for os.Remove(dirs[i]) != nil && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // the kernel frees a cgroup once its last task is reaped
			}
		}
	}
}

// ctl runs systemctl inside, with a deadline.
func (s *realSystemd) ctl(args ...string) (string, error) {
	return s.run(append([]string{"systemctl", "--no-pager"}, args...)...)
}

// run runs a command inside the namespace (its mounts, pids and root).
func (s *realSystemd) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(s.pid), "-m", "-p", "-r", "-w"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s: no answer within 2 minutes", strings.Join(args, " "))
	}
	return out.String(), err
}

// mustCtl runs systemctl and fails the test when it fails.
func (s *realSystemd) mustCtl(args ...string) string {
	s.t.Helper()
	out, err := s.ctl(args...)
	if err != nil {
		s.t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// mainPID is the unit's MainPID as the namespace sees it (0: none).
func (s *realSystemd) mainPID(unit string) int {
	out, _ := s.ctl("show", "-p", "MainPID", "--value", unit)
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	return pid
}

// hostPID turns a pid of the namespace into the machine's: the process
// whose NSpid line ends with nspid, in systemd's namespace.
func (s *realSystemd) hostPID(nspid int) int {
	ents, _ := os.ReadDir("/proc")
	want, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", s.pid))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); ns != want {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(nspid) {
				return pid
			}
		}
	}
	return 0
}

// journal is the unit's journal inside the namespace.
func (s *realSystemd) journal(unit string) string {
	out, _ := s.run("journalctl", "--no-pager", "-o", "short-monotonic", "-u", unit)
	return out
}

// passStressKnobs gives the unit's agents the stress knobs of the test's
// environment (.ci/stress sets them; a unit's agent gets no variable of
// the test's otherwise) in a drop-in. Call before daemon-reload.
func (s *realSystemd) passStressKnobs() {
	s.t.Helper()
	var env strings.Builder
	for _, k := range []string{failpoint.EnvSignalDelay, failpoint.EnvHandoffHold} {
		if v, ok := os.LookupEnv(k); ok {
			fmt.Fprintf(&env, "Environment=%s=%s\\n", k, v)
		}
	}
	if env.Len() == 0 {
		return
	}
	if out, err := s.run("sh", "-c", "mkdir -p /etc/systemd/system/deployd.service.d && "+
		"printf '[Service]\\n"+env.String()+"' > /etc/systemd/system/deployd.service.d/stress.conf"); err != nil {
		s.t.Fatalf("write the unit's drop-in of stress knobs: %v\n%s", err, out)
	}
}

// TestRealSystemdReloadStopRestart runs the agent as the unit `deployd
// startup systemd` writes, under a real systemd: 5 × `systemctl reload`
// under both loads (0 failed, the same worker pids, a new agent each time),
// then `systemctl stop` (every worker stopped by the agent, gracefully) and
// `systemctl restart` (measured: what it costs a client).
func TestRealSystemdReloadStopRestart(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	a := NewAgentDir(t, bins, appConfig("web", port, 2, ""))
	sd := bootSystemd(t, a.Dir, bins.Dir)
	a.Journal = func() string { return sd.journal("deployd") }
	if out, err := sd.run(bins.Deployd, "startup", "systemd", "-c", a.Config); err != nil {
		t.Fatalf("deployd startup systemd: %v\n%s", err, out)
	}
	sd.passStressKnobs()
	sd.mustCtl("daemon-reload")
	t0 := time.Now()
	sd.mustCtl("start", "deployd")
	st := a.WaitFor("ready under systemd", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	t.Logf("systemctl start: agent serving %s after the start", time.Since(t0).Round(time.Millisecond))
	if got := sd.mainPID("deployd"); got != st.Agent.PID {
		t.Fatalf("MainPID %d, the agent reports pid %d", got, st.Agent.PID)
	}
	pids := PIDs(appOf(st, "web"))

	stop := startLoad(t, port, 32, 3*time.Minute)
	for i := 1; i <= 5; i++ {
		old := st.Agent.PID
		t1 := time.Now()
		sd.mustCtl("reload", "deployd")
		st = a.WaitFor("a new agent", 60*time.Second, func(st *api.Status) bool {
			return st.Agent.PID != old && sd.mainPID("deployd") == st.Agent.PID && AllReady(st, "web", 2)
		})
		t.Logf("systemctl reload %d: agent %d -> %d in %s", i, old, st.Agent.PID, time.Since(t1).Round(time.Millisecond))
		if got := PIDs(appOf(st, "web")); fmt.Sprint(got) != fmt.Sprint(pids) {
			t.Fatalf("systemctl reload %d replaced workers: %v, then %v\n%s", i, pids, got, sd.journal("deployd"))
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive over 5 systemctl reloads", ka)
	requireNoFailures(t, "new-connection over 5 systemctl reloads", nka)

	// systemctl restart: a stop, then a start; connections in between are
	// refused (no socket unit holds the listener). Measured, not required.
	stop = startLoad(t, port, 8, time.Minute)
	t2 := time.Now()
	sd.mustCtl("restart", "deployd")
	st = a.WaitFor("ready after restart", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	took := time.Since(t2)
	ka, nka = stop()
	t.Logf("systemctl restart: serving again after %s; keep-alive %s; new-connection %s", took.Round(time.Millisecond), ka, nka)
	if fmt.Sprint(PIDs(appOf(st, "web"))) == fmt.Sprint(pids) {
		t.Errorf("systemctl restart kept the workers %v; a restart stops them", pids)
	}

	// systemctl stop: the agent stops every worker with its stop signal and
	// exits; nothing of the unit is left.
	hostWorkers := map[int]bool{}
	for _, w := range appOf(st, "web").Workers {
		if hp := sd.hostPID(w.PID); hp > 0 {
			hostWorkers[hp] = true
		}
	}
	if len(hostWorkers) != 2 {
		t.Fatalf("found %d of the 2 workers among the machine's pids", len(hostWorkers))
	}
	t3 := time.Now()
	sd.mustCtl("stop", "deployd")
	waitAllGone(t, hostWorkers, 30*time.Second)
	t.Logf("systemctl stop: returned after %s", time.Since(t3).Round(time.Millisecond))
	if out, _ := sd.ctl("is-active", "deployd"); strings.TrimSpace(out) != "inactive" {
		t.Errorf("after systemctl stop the unit is %q, want inactive", strings.TrimSpace(out))
	}
	j := sd.journal("deployd")
	for _, want := range []string{"agent ready", "stopping"} {
		if !strings.Contains(strings.ToLower(j), want) {
			t.Errorf("the journal lacks %q (journald gets the agent's log):\n%s", want, j)
		}
	}
	if strings.Contains(j, "SIGKILL") || strings.Contains(j, "Killing process") {
		t.Errorf("systemd killed processes at the stop (the agent must stop them):\n%s", j)
	}
}

// TestReleaseDebUnderRealSystemd installs the snapshot release's .deb
// (.ci/run makes it and names its folder in DEPLOYD_RELEASE_DIST) into a
// real systemd, adds an app to the config the package installed, and runs
// the packaged unit: it serves, `systemctl reload` keeps the workers, and
// `systemctl stop` ends the unit.
func TestReleaseDebUnderRealSystemd(t *testing.T) {
	dist := os.Getenv("DEPLOYD_RELEASE_DIST")
	if dist == "" {
		skipOrFail(t, "DEPLOYD_RELEASE_DIST is not set: .ci/run sets it after its snapshot release")
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "deployd_*_"+runtime.GOARCH+".deb"))
	if len(debs) != 1 {
		t.Fatalf("want one .deb for %s in %s, found %v", runtime.GOARCH, dist, debs)
	}
	port := FreePort(t)
	sd := bootSystemd(t, dist, bins.Dir)
	if out, err := sd.run("dpkg", "-i", debs[0]); err != nil {
		t.Fatalf("dpkg -i %s: %v\n%s", filepath.Base(debs[0]), err, out)
	}
	app := strings.ReplaceAll(appConfig("web", port, 2, ""), "%TESTAPP%", bins.TestApp)
	if out, err := sd.run("sh", "-c", "cat >> /etc/deployd/deployd.toml <<'EOF'\n"+app+"EOF\n"); err != nil {
		t.Fatalf("add an app to the packaged config: %v\n%s", err, out)
	}
	sd.mustCtl("daemon-reload")
	sd.mustCtl("enable", "--now", "deployd")
	status := func() *api.Status {
		t.Helper()
		out, err := sd.run("/usr/bin/deployd", "status", "--json")
		if err != nil {
			return nil
		}
		var st api.Status
		if json.Unmarshal([]byte(out), &st) != nil {
			return nil
		}
		return &st
	}
	var st *api.Status
	deadline := time.Now().Add(60 * time.Second)
	for st = status(); st == nil || !AllReady(st, "web", 2); st = status() {
		if time.Now().After(deadline) {
			t.Fatalf("the packaged unit did not serve web within 60 s:\n%s", sd.journal("deployd"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if body, err := get(t, port, "/"); err != nil || !strings.HasPrefix(body, "version=") {
		t.Fatalf("GET / from the packaged unit's workers: %q, %v", body, err)
	}
	pids := PIDs(appOf(st, "web"))
	old := st.Agent.PID
	sd.mustCtl("reload", "deployd")
	deadline = time.Now().Add(60 * time.Second)
	for st = status(); st == nil || st.Agent.PID == old || !AllReady(st, "web", 2); st = status() {
		if time.Now().After(deadline) {
			t.Fatalf("systemctl reload of the packaged unit: no new agent within 60 s:\n%s", sd.journal("deployd"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := PIDs(appOf(st, "web")); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("systemctl reload of the packaged unit replaced the workers: %v, then %v", pids, got)
	}
	sd.mustCtl("stop", "deployd")
	if out, _ := sd.ctl("is-active", "deployd"); strings.TrimSpace(out) != "inactive" {
		t.Errorf("after systemctl stop the packaged unit is %q", strings.TrimSpace(out))
	}
	t.Logf("%s: installed, served, reloaded with the same pids %v, stopped", filepath.Base(debs[0]), pids)
}
