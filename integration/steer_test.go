package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/steer"
)

// needSteering skips where the kernel cannot steer; under CI=true it fails.
func needSteering(t *testing.T) {
	t.Helper()
	if err := steer.Available(); err != nil {
		skipOrFail(t, fmt.Sprintf("kernel steering unavailable: %v", err))
	}
}

// TestSteeredPoolsUnderLoadDropNothing: with balance even and sticky,
// reloads (rolling and blue-green, which switches the live half of the
// kernel's map), a scale down and up, and an agent upgrade (the new agent
// takes the steering program over, and which half is live) under the
// keep-alive and new-connection loads lose no request; afterwards every
// worker answers (each is in the kernel's map).
func TestSteeredPoolsUnderLoadDropNothing(t *testing.T) {
	needSteering(t)
	for _, balance := range []string{"even", "sticky"} {
		t.Run(balance, func(t *testing.T) {
			port := FreePort(t)
			const instances = 3
			extra := fmt.Sprintf("balance = %q", balance)
			a := NewAgentDir(t, bins, versionedApp(port, instances, "v1", "", extra))
			a.UseOwnBinary()
			a.Start()
			st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			if got := appOf(st, "web").Balance; got != balance {
				t.Fatalf("status balance %q, want %q\n%s", got, balance, a.Log())
			}
			stop := startLoad(t, port, 20, 3*time.Minute)
			ver := "v1"
			reload := func(step, strategy string) {
				t.Helper()
				ver = map[string]string{"v1": "v2", "v2": "v1"}[ver]
				a.WriteConfig(versionedApp(port, instances, ver, "", extra))
				r := a.CLI("reload", "web", "--strategy", strategy)
				if r.Code != 0 {
					t.Fatalf("%s: exit %d\n%s\n%s", step, r.Code, r.Stderr, a.Log())
				}
				if cut := strings.Contains(r.Stderr, "web: cutover"); cut != (strategy == "blue-green") {
					t.Fatalf("%s (%s): a cutover line %v:\n%s", step, strategy, cut, r.Stderr)
				}
			}
			for i, strategy := range []string{"rolling", "blue-green", "rolling"} {
				reload(fmt.Sprintf("reload %d", i+1), strategy)
			}
			for _, n := range []string{"2", "3"} {
				if r := a.CLI("scale", "web", n); r.Code != 0 {
					t.Fatalf("scale %s: exit %d\n%s", n, r.Code, r.Stderr)
				}
			}
			cand := filepath.Join(t.TempDir(), "deployd-new")
			CopyFile(t, bins.DeploydV2, cand)
			if r := a.CLI("upgrade", "--binary", cand); r.Code != 0 {
				t.Fatalf("upgrade: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
			}
			a.WaitFor("adopted", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			reload("reload after the upgrade", "rolling")
			// The new agent writes to the half of the map the program
			// reads: the program itself gives every new worker connections.
			chosen := PIDs(a.App("web"))
			if balance == "sticky" {
				stickyIdentities(t, port, chosen)
			} else {
				identities(t, port, chosen)
			}
			for _, w := range a.App("web").Workers {
				if w.NewConnections == nil || *w.NewConnections == 0 {
					t.Errorf("after the upgrade and a reload, the program gave worker %d (pid %d) no connection", w.Slot, w.PID)
				}
			}
			reload("blue-green reload after the upgrade", "blue-green")
			ka, nka := stop()
			requireNoFailures(t, "keep-alive clients", ka)
			requireNoFailures(t, "new-connection clients", nka)
			st = a.Status()
			if got := appOf(st, "web").Balance; got != balance {
				t.Errorf("after the upgrade, status balance %q, want %q", got, balance)
			}
			var seen map[int]string
			if balance == "sticky" {
				seen = stickyIdentities(t, port, PIDs(appOf(st, "web")))
			} else {
				seen = identities(t, port, PIDs(appOf(st, "web")))
			}
			for pid, v := range seen {
				if v != ver {
					t.Errorf("worker %d answers %s, want %s", pid, v, ver)
				}
			}
		})
	}
}

// TestSteeringFallsBackToShared: an agent without CAP_BPF and
// CAP_SYS_ADMIN (dropped from its bounding set) cannot load the program;
// the app starts shared, and the log and status say so.
func TestSteeringFallsBackToShared(t *testing.T) {
	needSteering(t)
	setpriv, err := findTool("setpriv")
	if err != nil {
		skipOrFail(t, "setpriv (util-linux) is needed to drop capabilities: "+err.Error())
	}
	port := FreePort(t)
	a := NewAgentDir(t, bins, versionedApp(port, 2, "v1", "", `balance = "sticky"`))
	wrapper := filepath.Join(a.Dir, "deployd-without-bpf")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --bounding-set -bpf,-sys_admin,-perfmon -- %s \"$@\"\n", setpriv, a.Binary)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	a.Binary = wrapper
	a.Start()
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	app := appOf(st, "web")
	if app.Balance != "shared" {
		t.Fatalf("balance %q without CAP_BPF; want the shared fallback", app.Balance)
	}
	if !strings.Contains(strings.Join(app.Warnings, "\n"), `balance "sticky" asked, "shared" in effect`) {
		t.Errorf("status warnings %q must say the balance fell back", app.Warnings)
	}
	if log := a.Log(); !strings.Contains(log, "balance falls back to shared") || !strings.Contains(log, "CAP_BPF") {
		t.Errorf("the agent log must say it fell back and why:\n%s", log)
	}
	if r := a.CLI("status"); !strings.Contains(r.Stdout, `balance "sticky" asked`) {
		t.Errorf("deployd status must show the fallback:\n%s", r.Stdout)
	}
	identities(t, port, PIDs(app))
}

// stickyIdentities asks from 40 client addresses (127.0.0.2 ...), 3 times
// each: every client must get all its answers from one worker, and every
// worker of want (slot → pid) must answer some client. It returns each
// pid's version.
func stickyIdentities(t *testing.T, port int, want map[int]int) map[int]string {
	t.Helper()
	seen := map[int]string{}
	for c := 2; c < 42; c++ {
		src := fmt.Sprintf("127.0.0.%d", c)
		home := 0
		for range 3 {
			body, err := getFrom(src, port)
			if err != nil {
				t.Fatalf("GET / from %s: %v", src, err)
			}
			var ver string
			var pid, slot int
			if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &pid, &slot); err != nil {
				t.Fatalf("unexpected body %q: %v", body, err)
			}
			if home != 0 && pid != home {
				t.Fatalf("client %s answered by pid %d, then by pid %d", src, home, pid)
			}
			home, seen[pid] = pid, ver
		}
	}
	for slot, pid := range want {
		if _, ok := seen[pid]; !ok {
			t.Errorf("worker pid %d (slot %d) answered none of 40 clients (seen %v)", pid, slot, seen)
		}
	}
	return seen
}

// getFrom fetches http://127.0.0.1:port/ from source address src.
func getFrom(src string, port int) (string, error) {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return string(b), err
}

// findTool looks name up in the usual system folders (the agent's clean
// environment has a short PATH).
func findTool(name string) (string, error) {
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in /usr/bin, /bin, /usr/sbin, /sbin", name)
}

// servingStrength reports whether app serves with n ready workers that are
// not spares, none of them pid gone.
func servingStrength(st *api.Status, n, gone int) bool {
	serving := 0
	for _, w := range appOf(st, "web").Workers {
		if w.State == "ready" && !w.Spare && w.PID != gone {
			serving++
		}
	}
	return serving == n
}

// recoverAfterKill SIGKILLs a serving worker of a started app and returns
// how long until the app served with n ready workers again, by status.
func recoverAfterKill(t *testing.T, a *Agent, n int) time.Duration {
	t.Helper()
	var victim int
	for _, w := range appOf(a.Status(), "web").Workers {
		if !w.Spare {
			victim = w.PID
		}
	}
	t0 := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.WaitFor("full strength again", 20*time.Second, func(st *api.Status) bool { return servingStrength(st, n, victim) })
	return time.Since(t0)
}

// TestSpareTakesACrashedWorkersPlace: with spares = 1, an app that takes
// 1 s to start is back at full strength after a SIGKILL well before a
// restarted worker could be (spares = 0 measured beside it), serves from
// the former spare, and gets a new spare.
func TestSpareTakesACrashedWorkersPlace(t *testing.T) {
	needSteering(t)
	const delay = `TESTAPP_STARTUP_DELAY = "1s"`
	took := map[int]time.Duration{}
	for _, spares := range []int{0, 1} {
		port := FreePort(t)
		a := StartAgent(t, bins, versionedApp(port, 2, "v1", delay, fmt.Sprintf("balance = \"even\"\nspares = %d", spares)))
		a.WaitFor("ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2+spares) })
		if got := appOf(a.Status(), "web").Spares; got != spares {
			t.Fatalf("status spares %d, want %d", got, spares)
		}
		took[spares] = recoverAfterKill(t, a, 2)
		if spares == 1 {
			a.WaitFor("a new spare", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 3) })
			identities(t, port, servingPIDs(a.Status()))
		}
		a.Stop()
	}
	t.Logf("back at full strength after a SIGKILL (app start 1 s): spares = 0: %v, spares = 1: %v",
		took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))
	if took[1] >= time.Second {
		t.Errorf("with a spare, full strength took %v: as long as a restart", took[1])
	}
}

// servingPIDs maps slot → pid of the app's workers that are not spares.
func servingPIDs(st *api.Status) map[int]int {
	out := map[int]int{}
	for _, w := range appOf(st, "web").Workers {
		if !w.Spare {
			out[w.Slot] = w.PID
		}
	}
	return out
}

// TestAgentKillWithSteeredPool: an agent SIGKILLed under load leaves a
// steered pool serving; the next agent adopts the workers (it cannot take
// the steering over without the previous agent's handoff, so the log says
// the listener falls back to shared) and reloads with no failed request.
func TestAgentKillWithSteeredPool(t *testing.T) {
	needSteering(t)
	port := FreePort(t)
	const instances, extra = 2, steeredEven
	a := startSteered(t, port, instances)
	stop := startLoad(t, port, 8, 2*time.Minute)
	// A blue-green reload first: the second half of the steering map is
	// live when the agent dies.
	a.WriteConfig(versionedApp(port, instances, "v2", "", extra))
	if r := a.CLI("reload", "web", "--strategy", "blue-green"); r.Code != 0 || !strings.Contains(r.Stderr, "web: cutover") {
		t.Fatalf("blue-green reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := allWorkerPIDs(st)
	adoptAfterAgentKill(t, a, before, instances)
	a.WriteConfig(versionedApp(port, instances, "v1", "", extra))
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	for p, v := range identities(t, port, PIDs(appOf(a.Status(), "web"))) {
		if v != "v1" {
			t.Errorf("worker %d answers %s after the reload", p, v)
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "a blue-green reload, an agent SIGKILL and a reload", ka, nka)
	t.Logf("balance after the agent's crash: %q", appOf(a.Status(), "web").Balance)
}
