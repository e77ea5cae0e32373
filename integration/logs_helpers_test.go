package integration

// Helpers of the log tests and benchmark: reading the log files back,
// following them with the CLI, the agent's CPU time.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logFilesOf returns the current and rotated files of log_dir/base.log
// (e.g. base "web.out"), oldest rotation first, the current file last.
func logFilesOf(t testing.TB, dir, base string) []string {
	t.Helper()
	rotated, err := filepath.Glob(filepath.Join(dir, base+"-*.log"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(rotated) // the names sort by rotation time
	if _, err := os.Stat(filepath.Join(dir, base+".log")); err == nil {
		rotated = append(rotated, filepath.Join(dir, base+".log"))
	}
	return rotated
}

// spamCount tallies the "<prefix> <slot> <pid> <i>" lines of the test app
// found in log files (text format: "TIME [app slot pid] <prefix> ...").
type spamCount struct {
	prefix  string
	perLine int             // lines each pid writes
	seen    map[int][]uint8 // pid -> count of each i (1..perLine)
	slots   map[int]string  // pid -> slot, as the worker printed it
	bad     []string        // lines that do not parse, and markers
	files   int             // files read
	bytes   int64           // bytes read
	texts   int64           // bytes of the workers' text (with "\n"), not the prefixes
	total   int             // lines counted
	extra   map[[2]int]int  // (pid, i) counted more than once -> count
	order   map[int]int     // pid -> last i seen, to check order
	unorder map[int][2]int  // pid -> (previous i, i) of the first line that goes back
}

func newSpamCount(prefix string, perLine int) *spamCount {
	return &spamCount{prefix: prefix, perLine: perLine, seen: map[int][]uint8{}, slots: map[int]string{},
		extra: map[[2]int]int{}, order: map[int]int{}, unorder: map[int][2]int{}}
}

// read tallies every file, in the order given.
func (c *spamCount) read(t testing.TB, files []string) {
	t.Helper()
	key := []byte("] " + c.prefix + " ")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // pruned meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		c.files++
		c.bytes += int64(len(b))
		for len(b) > 0 {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				i = len(b) // a partial last line: the writer is mid-batch
			}
			line := b[:i]
			b = b[min(i+1, len(b)):]
			if j := bytes.Index(line, key); j >= 0 {
				c.addLine(line[j+2:])
			} else if bytes.Contains(line, []byte("deployd: dropped")) {
				c.bad = append(c.bad, string(line))
			}
		}
	}
}

func (c *spamCount) addLine(text []byte) {
	c.texts += int64(len(text)) + 1
	c.total++
	f := strings.Fields(string(text))
	if len(f) != 4 {
		c.bad = append(c.bad, string(text))
		return
	}
	pid, err1 := strconv.Atoi(f[2])
	i, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || i < 1 || i > c.perLine {
		c.bad = append(c.bad, string(text))
		return
	}
	counts := c.seen[pid]
	if counts == nil {
		counts = make([]uint8, c.perLine+1)
		c.seen[pid] = counts
		c.slots[pid] = f[1]
	}
	if counts[i]++; counts[i] > 1 {
		c.extra[[2]int{pid, i}] = int(counts[i])
	}
	if prev := c.order[pid]; i <= prev { // a gap is counted as missing
		if _, ok := c.unorder[pid]; !ok {
			c.unorder[pid] = [2]int{prev, i}
		}
	}
	c.order[pid] = i
}

// missing returns how many lines of pid were not seen.
func (c *spamCount) missing(pid int) int {
	n := 0
	for _, v := range c.seen[pid][1:] {
		if v == 0 {
			n++
		}
	}
	return n
}

// missingUpTo returns how many of pid's lines up to the last one seen
// (upto) were not seen.
func (c *spamCount) missingUpTo(pid int) (missing, upto int) {
	counts := c.seen[pid]
	for i := len(counts) - 1; i > 0; i-- {
		if counts[i] > 0 {
			upto = i
			break
		}
	}
	for _, v := range counts[1 : upto+1] {
		if v == 0 {
			missing++
		}
	}
	return missing, upto
}

// completeFor reports whether each of pids (by slot) has all its lines.
func (c *spamCount) completeFor(pids map[int]int) bool {
	for _, pid := range pids {
		if c.seen[pid] == nil || c.missing(pid) > 0 {
			return false
		}
	}
	return true
}

// complete reports whether want pids each have all their lines.
func (c *spamCount) complete(want int) bool {
	if len(c.seen) < want {
		return false
	}
	for pid := range c.seen {
		if c.missing(pid) > 0 {
			return false
		}
	}
	return true
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// follower is `deployd logs ... -f` running as a subprocess.
type follower struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string
	done chan struct{}
}

func startFollower(t *testing.T, a *Agent, args ...string) *follower {
	t.Helper()
	cmd := exec.Command(bins.Deployd, append([]string{"logs"}, args...)...)
	cmd.Dir = a.Dir
	cmd.Env = CleanEnv("DEPLOYD_SOCKET=" + a.Socket)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &follower{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			f.mu.Lock()
			f.out = append(f.out, sc.Text())
			f.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-f.done
		_ = cmd.Wait()
	})
	return f
}

// count returns how many lines printed so far match re.
func (f *follower) count(re *regexp.Regexp) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.out {
		if re.MatchString(l) {
			n++
		}
	}
	return n
}

// waitCount waits until want lines match re, failing after timeout.
func (f *follower) waitCount(t *testing.T, what string, re *regexp.Regexp, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n := f.count(re)
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			f.mu.Lock()
			defer f.mu.Unlock()
			t.Fatalf("%s: `deployd logs -f` printed %d of %d lines within %s; its output:\n%s",
				what, n, want, timeout, strings.Join(f.out, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLogsSettled waits until the files in dir have not grown for 300 ms;
// it returns when they last grew and their total size then.
func waitLogsSettled(t testing.TB, dir string) (time.Time, int64) {
	end, last := time.Now(), logBytes(t, dir)
	for time.Since(end) < 300*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		if s := logBytes(t, dir); s != last {
			end, last = time.Now(), s
		}
	}
	return end, last
}

// logBytes is the total size of the files in dir.
func logBytes(b testing.TB, dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// procCPU is the user+system CPU time pid has used (/proc/PID/stat fields 14
// and 15, in clock ticks of 1/100 s: USER_HZ is 100 on Linux).
func procCPU(b testing.TB, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// fillDisk writes path until its filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", path, err)
			}
			return
		}
	}
}

// checkLogsOfEveryApp checks `deployd logs --out -n 100` (every app) with only app
// web: want lines, each prefixed with the app.
func checkLogsOfEveryApp(t *testing.T, a *Agent, want int) {
	t.Helper()
	r := a.CLI("logs", "--out", "-n", "100")
	if r.Code != 0 || strings.Count(r.Stdout, "\nweb | ") != want-1 || !strings.HasPrefix(r.Stdout, "web | ") {
		t.Errorf("logs -n 100 (every app): want %d lines, each prefixed \"web | \":\n%s%s", want, r.Stdout, r.Stderr)
	}
	if r := a.CLI("logs", "nosuchapp"); r.Code != 2 || !strings.Contains(r.Stderr, "unknown app") {
		t.Errorf("logs nosuchapp: exit %d, want 2 and \"unknown app\":\n%s", r.Code, r.Stderr)
	}
}

// mountTmpfs mounts a tmpfs of size on dir, unmounted when the test ends
// (after what later cleanups do), or skips the test. Its root is mode 0755
// (a tmpfs is 1777 by default, a log_dir the agent refuses).
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir).CombinedOutput(); err != nil {
		skipOrFail(t, fmt.Sprintf("cannot mount a tmpfs for a full log_dir (needs root and CAP_SYS_ADMIN): %v: %s", err, bytes.TrimSpace(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// loadWhileLogging runs clients for d against the test app on port: half of
// them GET /log?n=2000 (the worker prints 2000 lines before it answers),
// the others GET /.
func loadWhileLogging(t *testing.T, port, clients int, d time.Duration) (requests, failures int, errs []string) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := time.Now().Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/log?n=2000"
			if c%2 == 1 {
				path = "/"
			}
			for time.Now().Before(stop) {
				_, err := get(t, port, path)
				mu.Lock()
				requests++
				if err != nil {
					failures++
					errs = append(errs, err.Error())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return requests, failures, errs
}
