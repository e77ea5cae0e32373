package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deployd/deployd/agent/api"
)

// pageLag bounds how long after the agent's status shows a change the
// dashboard page shows it: the dashboard reads status once a second, so
// one poll, plus the push and the render on a loaded machine.
const pageLag = 1500 * time.Millisecond

// TestDashboardInBrowser drives `deployd dashboard` in Debian's Chromium:
// the page loads without a console error, shows the workers status --json
// shows, follows a reload from the CLI (new pids, the timeline), a crash and
// its restart, and log lines of both streams as they are written; a
// missing or wrong token gets 403; a user outside the privilege table gets
// no dashboard.
func TestDashboardInBrowser(t *testing.T) {
	browser := chromiumPath(t)
	port := FreePort(t)
	a := StartAgent(t, bins, appConfig("web", port, 2, `env = { TESTAPP_STARTUP_DELAY = "700ms" }`)+
		appConfig("api", FreePort(t), 1, ""))
	a.WaitFor("all ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) && AllReady(st, "api", 1) })
	url := startDashboard(t, a)

	base := url[:strings.Index(url[len("http://"):], "/")+len("http://")]
	for _, u := range []string{base + "/", base + "/wrongtoken/", base + "/wrongtoken/events", url[:len(url)-2] + "/"} {
		if code := httpCode(t, u); code != http.StatusForbidden {
			t.Errorf("GET %s: %d, want 403", u, code)
		}
	}

	if os.Getuid() == 0 {
		// A user outside the privilege table (not the agent's uid, not in
		// its socket_group) gets no dashboard: the command fails before it
		// serves anything.
		a.CallTimeout = 30 * time.Second
		r := a.CLIAs(&syscall.Credential{Uid: 65534, Gid: 65534}, "dashboard", "--no-open")
		a.CallTimeout = 0
		if r.Code == 0 || strings.Contains(r.Stdout, "http://") {
			t.Errorf("dashboard as nobody: exit %d, stdout %q, want a failure and no URL", r.Code, r.Stdout)
		}
		t.Logf("dashboard as nobody: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	}

	b := newBrowser(t, browser)
	b.do("open the page", chromedp.EmulateViewport(1280, 860), chromedp.Navigate(url))
	var st api.Status
	if r := a.CLI("status", "--json"); r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &st) != nil {
		t.Fatalf("status --json: %+v", r)
	}
	want := map[string][]int{}
	for _, app := range st.Apps {
		for _, w := range app.Workers {
			want[app.Name] = append(want[app.Name], w.PID)
		}
		slices.Sort(want[app.Name])
	}
	b.waitFor("the workers of status --json", 10*time.Second, func() bool {
		for app, pids := range want {
			if !slices.Equal(b.pids(app), pids) {
				return false
			}
		}
		return true
	})

	if os.Getenv("DEPLOYD_DASHBOARD_SCREENSHOT") != "" {
		// For the picture in the docs: a crash of api's worker, then a
		// minute of plots and log lines first.
		syscall.Kill(want["api"][0], syscall.SIGKILL)
		for range 20 {
			get(t, port, "/log?n=5000")
			time.Sleep(2 * time.Second)
		}
	}

	checkReload(t, a, b, want["web"])
	checkCrash(t, a, b)
	checkLogLines(t, b, port)
	b.checkConsole()
}

// checkReload runs a reload from the CLI: each new pid shows on the page
// within pageLag of the agent's status, with its timeline entry, and the
// old workers leave it. A screenshot is taken mid-reload.
func checkReload(t *testing.T, a *Agent, b *browser, old []int) {
	t.Helper()
	reloaded := make(chan Result, 1)
	go func() { reloaded <- a.CLI("reload", "web") }()
	seenStatus, seenPage := map[int]time.Time{}, map[int]time.Time{}
	shot := false
	deadline := time.Now().Add(60 * time.Second)
	for done := false; ; {
		select {
		case r := <-reloaded:
			if r.Code != 0 {
				t.Fatalf("reload: %+v", r)
			}
			done = true
		default:
		}
		now := time.Now()
		for _, w := range a.App("web").Workers {
			if !slices.Contains(old, w.PID) && seenStatus[w.PID].IsZero() {
				seenStatus[w.PID] = now
			}
		}
		onPage := b.pids("web")
		for _, pid := range onPage {
			if !slices.Contains(old, pid) && seenPage[pid].IsZero() {
				seenPage[pid] = time.Now()
			}
		}
		if !shot && (len(onPage) > 2 && b.eval(newReady(old)) || done) {
			// Mid-reload: a new worker serves beside old ones.
			b.screenshot(t, "reload")
			shot = true
		}
		if done && len(seenPage) >= len(seenStatus) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reload: after 60s, new pids in status %v, on the page %v", seenStatus, seenPage)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seenStatus) != 2 {
		t.Errorf("new pids in status: %v, want 2", seenStatus)
	}
	for pid, at := range seenStatus {
		lag := seenPage[pid].Sub(at)
		t.Logf("pid %d: on the page %s after status showed it", pid, lag.Round(time.Millisecond))
		if lag > pageLag {
			t.Errorf("pid %d: on the page %s after status showed it, want at most %s", pid, lag, pageLag)
		}
		b.waitFor(fmt.Sprintf("timeline entry: pid %d started", pid), pageLag, func() bool {
			return b.count(fmt.Sprintf(`#timeline li[data-kind=started][data-pid="%d"]`, pid)) == 1
		})
	}
	b.waitFor("the old workers gone from the page and the timeline", 3*time.Second, func() bool {
		n := 0
		for _, pid := range old {
			n += b.count(fmt.Sprintf(`#timeline li[data-kind=exited][data-pid="%d"]`, pid))
		}
		return n == len(old) && !slices.ContainsFunc(b.pids("web"), func(p int) bool { return slices.Contains(old, p) })
	})

}

// checkCrash SIGKILLs a worker: the timeline shows the crash and the
// restart, the card the new pid.
func checkCrash(t *testing.T, a *Agent, b *browser) {
	t.Helper()
	victim := a.App("web").Workers[0]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st2 := a.WaitFor("slot restarted", 20*time.Second, func(st *api.Status) bool {
		for _, ap := range st.Apps {
			for _, w := range ap.Workers {
				if ap.Name == "web" && w.Slot == victim.Slot && w.PID != victim.PID && w.State == "ready" {
					return true
				}
			}
		}
		return false
	})
	newPID := PIDs(appOf(st2, "web"))[victim.Slot]
	b.waitFor("the crash and the restart on the page", 3*time.Second, func() bool {
		return b.count(fmt.Sprintf(`#timeline li[data-kind=crash][data-pid="%d"]`, victim.PID)) >= 1 &&
			b.count(fmt.Sprintf(`#timeline li[data-pid="%d"]:is([data-kind=restart],[data-kind=started])`, newPID)) >= 1 &&
			slices.Contains(b.pids("web"), newPID)
	})
}

// checkLogLines: log lines show as they are written, stdout's from GET
// /log, stderr's (marked) from the old workers' stop lines of the reload.
func checkLogLines(t *testing.T, b *browser, port int) {
	t.Helper()
	if _, err := get(t, port, "/log?n=3"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	b.waitFor("stdout lines of GET /log", 2*time.Second, func() bool {
		return b.count(`.log[data-app=web] .ll[data-stream=out]`) > 0 &&
			b.eval(`[...document.querySelectorAll('.log[data-app=web] .ll[data-stream=out]')].some(e => / log \d+ \d+ 2$/.test(e.textContent))`)
	})
	t.Logf("a log line on the page %s after it was written", time.Since(t0).Round(time.Millisecond))
	b.waitFor("stderr lines, marked", time.Second, func() bool {
		return b.eval(`[...document.querySelectorAll('.log[data-app=web] .ll[data-stream=err]')].some(e => e.textContent.includes('testapp: stopping'))`)
	})
}

// newReady is a script that tells whether the page shows web reloading
// with a worker not in old ready.
func newReady(old []int) string {
	b, _ := json.Marshal(old)
	return fmt.Sprintf(`(() => {
		const app = document.querySelector('section.app[data-app=web]');
		return app.querySelector('[data-role=app-state]').textContent === 'reloading' &&
			[...app.querySelectorAll('.worker[data-state=ready]')].some(e => !%s.includes(+e.dataset.pid));
	})()`, b)
}

// chromiumPath finds Debian's Chromium, or skips the test.
func chromiumPath(t *testing.T) string {
	if p := lookChromium(); p != "" {
		return p
	}
	skipOrFail(t, "no Chromium (apt-get install chromium)")
	return ""
}

// lookChromium returns the path of Chromium, "" if there is none.
func lookChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// startDashboard runs `deployd dashboard --no-open` against a and returns
// the URL it prints; it is stopped (SIGINT) when the test ends.
func startDashboard(t *testing.T, a *Agent) string {
	t.Helper()
	url, _ := runDashboardCmd(t, a, nil, "--no-open")
	return url
}

// runDashboardCmd runs `deployd dashboard args...` against a with the
// test's clean environment and env, and returns the URL it prints and its
// pid; it is stopped (SIGINT, exit 0 expected) when the test ends.
func runDashboardCmd(t *testing.T, a *Agent, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bins.Deployd, append([]string{"dashboard"}, args...)...)
	cmd.Dir = a.Dir
	cmd.Env = append(CleanEnv("DEPLOYD_SOCKET="+a.Socket, "DEPLOYD_CONFIG="+a.Config), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "dashboard: "); ok {
				urlc <- u
			}
		}
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("deployd dashboard exited %d after SIGINT, want 0", code)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("deployd dashboard still runs 10s after SIGINT")
		}
	})
	select {
	case u := <-urlc:
		return u, cmd.Process.Pid
	case <-exited:
		t.Fatal("deployd dashboard exited before it printed its URL")
	case <-time.After(30 * time.Second):
		t.Fatal("deployd dashboard printed no URL within 30s")
	}
	return "", 0
}

func httpCode(t *testing.T, u string) int {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// browser is one headless Chromium tab; every call has a deadline.
type browser struct {
	t       *testing.T
	ctx     context.Context
	mu      sync.Mutex
	console []string // errors and exceptions the page reported
}

func newBrowser(t *testing.T, path string) *browser {
	t.Helper()
	// The browser as a whole lives at most as long as this test may.
	root, cancelRoot := context.WithTimeout(context.Background(), 5*time.Minute)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
	}
	t.Cleanup(cancelRoot)
	var b *browser
	// Chromium has been seen to crash once at start on a loaded machine:
	// a new browser, with a new profile, is tried up to three times.
	for attempt := 1; b == nil; attempt++ {
		actx, cancelAlloc := chromedp.NewExecAllocator(root, append(opts, chromedp.UserDataDir(t.TempDir()))...)
		ctx, cancelTab := chromedp.NewContext(actx)
		err := chromedp.Do(ctx)
		if err == nil {
			t.Cleanup(func() { cancelTab(); cancelAlloc() })
			b = &browser{t: t, ctx: ctx}
			break
		}
		cancelTab()
		cancelAlloc()
		if attempt == 3 {
			t.Fatalf("start chromium: %v", err)
		}
		t.Logf("start chromium (attempt %d): %v", attempt, err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.console = append(b.console, m.String())
				b.mu.Unlock()
			}
		}
	}()
	return b
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func evalIn[T any](b *browser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

func (b *browser) eval(js string) bool { b.t.Helper(); return evalIn[bool](b, js) }

func (b *browser) count(sel string) int {
	b.t.Helper()
	return evalIn[int](b, fmt.Sprintf("document.querySelectorAll(%q).length", sel))
}

// pids are the worker pids the page shows for app, sorted.
func (b *browser) pids(app string) []int {
	b.t.Helper()
	p := evalIn[[]int](b, fmt.Sprintf(`[...document.querySelectorAll('section.app[data-app=%q] .worker')].map(e => +e.dataset.pid)`, app))
	slices.Sort(p)
	return p
}

func (b *browser) waitFor(what string, d time.Duration, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			html := evalIn[string](b, "document.body.innerText")
			b.t.Fatalf("page: no %s within %s; it shows:\n%s", what, d, html)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// screenshot saves the page as a PNG: to $DEPLOYD_DASHBOARD_SCREENSHOT
// when set (docs/dashboard.png is made so), else into the test's folder.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := os.Getenv("DEPLOYD_DASHBOARD_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), name+".png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (b *browser) checkConsole() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.console) > 0 {
		b.t.Errorf("the page reported errors on its console:\n%s", strings.Join(b.console, "\n"))
	}
}
