package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deployd/deployd/agent/api"
)

// chattyApp writes lines of 4000 bytes, 5000 a second (20 MB/s), to stdout.
const chattyApp = `L=$(head -c 4000 /dev/zero | tr '\0' x); exec 2>&1; ` +
	`while :; do yes "$L" | head -n 500; sleep 0.1; done`

// TestDashboardStalledPagesBounded keeps the dashboard full of pages that
// stop reading (raw TCP connections that send their request and never
// read: 15 at once, then one more every 250 ms as the dashboard drops
// them) beside one page that reads and an app that logs 20 MB/s: the
// dashboard's RSS stays under 40 MiB (each page's queue is bounded in
// bytes and a page that stops reading is dropped), and a new page still
// gets its snapshot.
func TestDashboardStalledPagesBounded(t *testing.T) {
	parallelUnderLoad(t)
	a := StartAgent(t, bins, fmt.Sprintf(`[apps.chatty]
command = ["/bin/sh", "-c", %q]
instances = 1
listen = ["tcp://127.0.0.1:%d"]
ready = "delay:100ms"
`, chattyApp, FreePort(t)))
	a.WaitFor("chatty ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "chatty", 1) })
	url, pid := runDashboardCmd(t, a, nil, "--no-open")
	hostport, path := splitURL(t, url)
	before := procStatusKiB(t, pid, "VmRSS")

	read := readingPage(t, url+"events")
	for range 15 {
		stalledPage(t, hostport, path+"events")
	}
	var peak int64
	next := time.Now()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		peak = max(peak, procStatusKiB(t, pid, "VmRSS"))
		if time.Now().After(next) {
			stalledPage(t, hostport, path+"events") // a 503 while 16 are open
			next = next.Add(250 * time.Millisecond)
		}
	}
	hwm := procStatusKiB(t, pid, "VmHWM")
	t.Logf("dashboard RSS: %d KiB before the pages, peak %d KiB while they were open (VmHWM %d KiB); the reading page got %d KiB",
		before, peak, hwm, read.Load()>>10)
	if hwm > 40<<10 {
		t.Errorf("dashboard peak RSS %d KiB with 16 stalled pages, want under 40 MiB", hwm)
	}
	if read.Load() == 0 {
		t.Errorf("the reading page got nothing")
	}
	readSnapshot(t, url+"events")
}

// readingPage reads the event stream at url into nothing until the test
// ends and counts the bytes.
func readingPage(t *testing.T, url string) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			k, err := resp.Body.Read(buf)
			n.Add(int64(k))
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return &n
}

// splitURL returns host:port and the path (/TOKEN/) of the dashboard's URL.
func splitURL(t *testing.T, url string) (string, string) {
	t.Helper()
	rest, ok := strings.CutPrefix(url, "http://")
	i := strings.Index(rest, "/")
	if !ok || i < 0 {
		t.Fatalf("dashboard URL %q: want http://HOST:PORT/TOKEN/", url)
	}
	return rest[:i], rest[i:]
}

// stalledPage connects to hostport with a tiny receive buffer, sends a GET
// of path and never reads; the connection is closed when the test ends.
func stalledPage(t *testing.T, hostport, path string) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", hostport)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, hostport); err != nil {
		t.Fatal(err)
	}
}

// readSnapshot opens the event stream at url and reads until its snapshot.
func readSnapshot(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		if resp.StatusCode == http.StatusServiceUnavailable && ctx.Err() == nil {
			// Still full of stalled pages: the next write deadline frees one.
			resp.Body.Close()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s, want 200", url, resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			if sc.Text() == "event: snapshot" {
				return
			}
		}
		t.Fatalf("GET %s: no snapshot (%v)", url, sc.Err())
	}
}

// procStatusKiB reads a field (VmRSS, VmHWM) of /proc/PID/status in KiB.
func procStatusKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %s: %v", pid, line, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status: no %s", pid, field)
	return 0
}

// TestDashboardTokenOnNoCommandLine runs `deployd dashboard` with a display
// and a fake xdg-open first in PATH that records its arguments and stays
// alive: while it runs, no /proc/*/cmdline and no readable /proc/*/environ
// holds the token; xdg-open was given a file:// URL of a 0600 file in a
// 0700 folder that leads to the tokened URL (Chromium, when installed,
// opens it and shows the dashboard; the scan is made again then), and the
// file is gone once a browser came with the token.
func TestDashboardTokenOnNoCommandLine(t *testing.T) {
	parallel(t)
	a := StartAgent(t, bins, appConfig("web", FreePort(t), 1, ""))
	a.WaitFor("web ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 1) })
	bin := filepath.Join(t.TempDir(), "bin")
	rec, release := filepath.Join(bin, "argv"), filepath.Join(bin, "release")
	fake := fmt.Sprintf(`#!/bin/sh
{ echo $$; printf '%%s\n' "$@"; } > %[1]s.tmp && mv %[1]s.tmp %[1]s
i=0; while [ ! -e %[2]s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
`, rec, release)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "xdg-open"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(release, nil, 0o644) })
	url, _ := runDashboardCmd(t, a, []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "DISPLAY=:99"})
	_, path := splitURL(t, url)
	token := strings.Trim(path, "/")

	var lines []string
	eventually(t, a, "xdg-open ran", 20*time.Second, func() bool {
		b, err := os.ReadFile(rec)
		lines = strings.Split(strings.TrimSpace(string(b)), "\n")
		return err == nil
	})
	if len(lines) != 2 {
		t.Fatalf("xdg-open's pid and arguments: %q, want its pid and one argument", lines)
	}
	for _, f := range procFilesWith(t, token) {
		t.Errorf("%s holds the dashboard's token", f)
	}
	if environ, err := os.ReadFile("/proc/" + lines[0] + "/environ"); err != nil {
		t.Errorf("xdg-open's environment: %v", err)
	} else if strings.Contains(string(environ), token) {
		t.Errorf("xdg-open's environment holds the token")
	}

	page := checkRedirectPage(t, lines[1], url)
	if path := lookChromium(); path != "" {
		// As a browser that xdg-open started: the file leads to the page.
		b := newBrowser(t, path)
		b.do("open "+lines[1], chromedp.Navigate(lines[1]))
		b.waitFor("the dashboard, from the redirecting page", 10*time.Second, func() bool {
			return b.eval(fmt.Sprintf(`location.href === %q && document.querySelectorAll('section.app[data-app=web]').length === 1`, url))
		})
		for _, f := range procFilesWith(t, token) {
			t.Errorf("with the page open in Chromium: %s holds the dashboard's token", f)
		}
	} else if code := httpCode(t, url); code != http.StatusOK {
		t.Fatalf("GET %s: %d, want 200", url, code)
	}
	eventually(t, a, "the redirecting page removed after the browser came", 5*time.Second, func() bool {
		_, err := os.Lstat(filepath.Dir(page))
		return errors.Is(err, fs.ErrNotExist)
	})
}

// checkRedirectPage checks the argument xdg-open got: a file:// URL of a
// file of this user, mode 0600, in a folder of mode 0700, that holds url.
// It returns the file's path.
func checkRedirectPage(t *testing.T, arg, url string) string {
	t.Helper()
	path, ok := strings.CutPrefix(arg, "file://")
	if !ok {
		t.Fatalf("xdg-open's argument %q, want a file:// URL", arg)
	}
	for p, want := range map[string]fs.FileMode{path: 0o600, filepath.Dir(path): fs.ModeDir | 0o700} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, owner %d; want %v, owner %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, want, os.Getuid())
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `http-equiv="refresh" content="1;url=`+url+`"`) ||
		!strings.Contains(string(b), `window.location.replace("`+url+`")`) {
		t.Errorf("%s does not lead to %s:\n%s", path, url, b)
	}
	return path
}

// procFilesWith returns every /proc/*/cmdline, and every /proc/*/environ
// this test may read, that holds s.
func procFilesWith(t *testing.T, s string) []string {
	t.Helper()
	var found []string
	for _, name := range []string{"cmdline", "environ"} {
		files, err := filepath.Glob("/proc/[0-9]*/" + name)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				if name == "cmdline" && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
					t.Errorf("%s: %v", f, err)
				}
				continue // gone, or (environ) another user's
			}
			if strings.Contains(string(b), s) {
				found = append(found, f)
			}
		}
	}
	return found
}
