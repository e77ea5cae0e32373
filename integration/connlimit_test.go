package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
)

var (
	floodOnce sync.Once
	floodPath string
	floodErr  error
)

// ctlFlood builds integration/ctlflood once.
func ctlFlood(t *testing.T) string {
	t.Helper()
	floodOnce.Do(func() { floodPath, floodErr = Build(bins.Dir, "ctlflood", "./integration/ctlflood", "") })
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	return floodPath
}

// floodCounts is ctlflood's summary line.
type floodCounts struct {
	Kept, Refused, Closed, Failed int
	Refusal, FirstError           string
}

// statusOrErr asks the agent's status with a deadline and returns its error
// (under a flood a call may be refused: the caller retries).
func statusOrErr(a *Agent, d time.Duration) (*api.Status, error) {

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return a.Client.Status(ctx, "")
}

// cliAsBounded runs the CLI as cred with a deadline; a miss is exit -1, not a
// failure: under a flood a member's call may go unanswered.
func cliAsBounded(t *testing.T, a *Agent, cred *syscall.Credential, d time.Duration, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bins.Deployd, args...)
	cmd.Env = CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.Code = -1
		r.Stderr += fmt.Sprintf("\n(no answer within %s)", d)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run deployd %v: %v", args, err)
	}
	return r
}

// procFigures returns pid's open descriptors and resident memory.
func procFigures(pid int) (fds int, rssKiB int) {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			rssKiB, _ = strconv.Atoi(f[1])
		}
	}
	return len(ents), rssKiB
}

// A socket_group member opens thousands of keep-alive connections and keeps
// them idle while a worker of another app is SIGKILLed: the worker is
// replaced, root's status answers, the member is told which limit it hit,
// and the agent's descriptors stay far below its RLIMIT_NOFILE. Before
// connections were capped, the agent took every connection until it ran out
// of descriptors: the killed worker could not be restarted ("too many open
// files") and root's status got no answer.
func TestMemberConnectionFloodCannotStarveTheAgent(t *testing.T) {
	m := newMember(t)
	flood := ctlFlood(t)
	webPort, apiPort := FreePort(t), FreePort(t)
	a := startMemberAgent(t, m, "", appConfig("web", webPort, 1, "")+appConfig("api", apiPort, 1, ""))
	// An agent under LimitNOFILE=2048, so that a bounded flood reaches it.
	const nofile = 2048
	if err := unix.Prlimit(a.PID(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: nofile, Max: nofile}, nil); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "both apps ready", 30*time.Second, func(st *api.Status) bool {
		return AllReady(st, "web", 1) && AllReady(st, "api", 1)
	})
	fds0, rss0 := procFigures(a.PID())

	const conns = 3000
	cmd := exec.Command(flood, "-socket", a.Socket, "-n", strconv.Itoa(conns), "-parallel", "128", "-timeout", "2s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.Cred, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once ctlflood was waited for
	lines := make(chan string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	var fc floodCounts
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("ctlflood printed nothing: %s", stderr.String())
		}
		if err := json.Unmarshal([]byte(l), &fc); err != nil {
			t.Fatalf("ctlflood: %v: %q", err, l)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("the flood of %d connections did not end within 90 s", conns)
	}
	fds, rss := procFigures(a.PID())
	t.Logf("flood of %d connections by uid %d: kept %d, refused with 503 %d, closed unanswered %d, failed %d (%s)",
		conns, m.UID, fc.Kept, fc.Refused, fc.Closed, fc.Failed, fc.FirstError)
	t.Logf("agent: %d descriptors and %d KiB RSS before, %d and %d KiB under the flood (RLIMIT_NOFILE %d)", fds0, rss0, fds, rss, nofile)

	// Root's status answers, and the killed worker of the other app is
	// replaced, while the member keeps its connections.
	before := appOf(waitStatus(t, a, "status during the flood", 5*time.Second, func(*api.Status) bool { return true }), "api").Workers[0].PID
	if err := syscall.Kill(before, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	st := waitStatus(t, a, "the killed api worker replaced during the flood", 20*time.Second, func(st *api.Status) bool {
		return AllReady(st, "api", 1) && appOf(st, "api").Workers[0].PID != before
	})
	t.Logf("killed api worker %d replaced by %d in %s during the flood", before, appOf(st, "api").Workers[0].PID,
		time.Since(killed).Round(time.Millisecond))
	if fds >= nofile/2 {
		t.Errorf("the agent held %d descriptors under the flood, more than half its limit %d", fds, nofile)
	}
	if fc.Kept > 64 || fc.Refused == 0 {
		t.Errorf("kept %d connections (the limit per uid is 64), refused %d with an answer", fc.Kept, fc.Refused)
	}
	if !strings.Contains(fc.Refusal, "too many control connections") || !strings.Contains(fc.Refusal, "the limit per uid") {
		t.Errorf("the refusal does not name the limit: %q", fc.Refusal)
	}
	// The member's CLI is told, and root's commands run.
	r := cliAsBounded(t, a, m.Cred, 20*time.Second, "status")
	if r.Code != 1 || !strings.Contains(r.Stderr, "too many control connections") {
		t.Errorf("member's status during the flood: exit %d, want 1 with the limit:\n%s", r.Code, r.Stderr)
	}
	if r := cliAsBounded(t, a, nil, 20*time.Second, "restart", "web"); r.Code != 0 {
		t.Errorf("root's restart during the flood: exit %d\n%s", r.Code, r.Stderr)
	}
	if !strings.Contains(a.Log(), "control connection refused") {
		t.Error("the agent log does not say it refused connections")
	}

	// Once the member lets go, its places come back.
	stdin.Close()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("ctlflood did not exit after its stdin closed")
	}
	if r := cliAsBounded(t, a, m.Cred, 20*time.Second, "status"); r.Code != 0 {
		t.Errorf("member's status after the flood: exit %d\n%s", r.Code, r.Stderr)
	}
}

// waitStatus polls status (each call within 5 s) until cond holds or
// timeout passes; it fails the test then.
func waitStatus(t *testing.T, a *Agent, what string, timeout time.Duration, cond func(*api.Status) bool) *api.Status {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		st, err := statusOrErr(a, 5*time.Second)
		if err == nil && cond(st) {
			return st
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last error: %v)\nagent log:\n%s", timeout, what, last, tail(a.Log(), 40))
	return nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
