package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a process the harness started, in its own process group, killed with the
// harness (Pdeathsig). Every proc is in the registry until it has been waited for, so
// cleanup can stop whatever is left even after an error or Ctrl-C.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait returned
	err  error         // Wait's result, valid after done
	// lines receives the stdout lines when the proc was started with watchLines;
	// owned by the scanning goroutine, closed at EOF.
	lines chan string
}

// registry holds every started proc not yet reaped. Safe for concurrent use.
var registry = struct {
	mu    sync.Mutex
	procs map[*proc]bool
	// extra holds pids started by others (deployd workers, PM2) that cleanup must
	// make sure are gone: pid -> what it is.
	extra map[int]string
}{procs: map[*proc]bool{}, extra: map[int]string{}}

// startProc starts cmd in a new process group with output going to logPath (appended).
// With watchLines, stdout is scanned and each line is sent to p.lines (and the log);
// else stdout goes to cmd.Stdout when set, or to the log.
func startProc(name string, cmd *exec.Cmd, logPath string, watchLines bool) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.Stderr = logf
	var pr *os.File
	if watchLines {
		var pw *os.File
		if pr, pw, err = os.Pipe(); err != nil {
			logf.Close()
			return nil, err
		}
		cmd.Stdout = pw
		defer pw.Close()
		p.lines = make(chan string, 64)
	} else if cmd.Stdout == nil {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		if pr != nil {
			pr.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	registry.mu.Lock()
	registry.procs[p] = true
	registry.mu.Unlock()
	var scanned sync.WaitGroup
	if pr != nil {
		scanned.Go(func() {
			defer pr.Close()
			defer close(p.lines)
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				line := sc.Text()
				fmt.Fprintln(logf, line)
				select {
				case p.lines <- line:
				default: // nobody listening: the log has it
				}
			}
		})
	}
	go func() {
		p.err = cmd.Wait()
		scanned.Wait()
		logf.Close()
		registry.mu.Lock()
		delete(registry.procs, p)
		registry.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has been reaped.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process (not its group: a manager drains its own workers) and
// waits up to grace, then SIGKILLs the whole group and waits. Safe to call twice.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s (pid %d) did not exit within %v of %v: killed", p.name, p.pid(), grace, sig)
}

// waitLine waits for a stdout line containing substr.
func (p *proc) waitLine(ctx context.Context, substr string, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				return fmt.Errorf("%s exited before printing %q: %v", p.name, substr, p.err)
			}
			if strings.Contains(line, substr) {
				return nil
			}
		case <-t.C:
			return fmt.Errorf("%s: no %q within %v", p.name, substr, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// trackPID records a pid started by a manager so that cleanup kills it if it is left.
func trackPID(pid int, what string) {
	registry.mu.Lock()
	registry.extra[pid] = what
	registry.mu.Unlock()
}

// cleanupAll stops every proc still running (SIGTERM to its group, then SIGKILL) and
// kills every tracked pid still alive. It returns what it had to clean up.
func cleanupAll() []string {
	registry.mu.Lock()
	var ps []*proc
	for p := range registry.procs {
		ps = append(ps, p)
	}
	extra := registry.extra
	registry.extra = map[int]string{}
	registry.mu.Unlock()
	var left []string
	for _, p := range ps {
		left = append(left, fmt.Sprintf("%s (pid %d)", p.name, p.pid()))
		_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
			<-p.done
		}
	}
	for pid, what := range extra {
		if alive(pid) {
			left = append(left, fmt.Sprintf("%s (pid %d)", what, pid))
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return left
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// clkTck is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux).
const clkTck = 100

// cpuTime returns the user+system CPU time pid has used so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	// Fields after the command: state(3) ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime(14) stime(15).
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// rss returns pid's resident set size (VmRSS) in bytes.
func rss(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseVmRSS(f)
}

func parseVmRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// procSampler samples the CPU time and RSS of a set of pids while a run lasts.
type procSampler struct {
	pids   []int
	t0     time.Time
	cpu0   map[int]time.Duration
	stop   chan struct{}
	done   chan struct{}
	maxRSS map[int]int64 // owned by the sampling goroutine until done
	// busy0 is the machine's busy CPU time at the start, self0 the harness's own.
	busy0, self0 time.Duration
	// Set by finish: the machine's and the harness's CPU use over the run, in % of
	// one core.
	busyPercent, selfPercent float64
}

// procUsage is one pid's use over a sampled run.
type procUsage struct {
	CPUPercent float64 // of one core
	MaxRSS     int64
}

func sampleProcs(pids []int) *procSampler {
	s := &procSampler{pids: pids, t0: time.Now(), cpu0: map[int]time.Duration{},
		stop: make(chan struct{}), done: make(chan struct{}), maxRSS: map[int]int64{}}
	for _, pid := range pids {
		s.cpu0[pid], _ = cpuTime(pid)
	}
	s.busy0, _ = machineBusy()
	s.self0, _ = cpuTime(os.Getpid())
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			for _, pid := range s.pids {
				if r, err := rss(pid); err == nil {
					s.maxRSS[pid] = max(s.maxRSS[pid], r)
				}
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// finish ends the sampling and returns each pid's usage.
func (s *procSampler) finish() map[int]procUsage {
	close(s.stop)
	<-s.done
	wall := time.Since(s.t0)
	out := map[int]procUsage{}
	for _, pid := range s.pids {
		c, err := cpuTime(pid)
		u := procUsage{MaxRSS: s.maxRSS[pid]}
		if err == nil && wall > 0 {
			u.CPUPercent = 100 * float64(c-s.cpu0[pid]) / float64(wall)
		}
		out[pid] = u
	}
	if busy, err := machineBusy(); err == nil && wall > 0 {
		s.busyPercent = 100 * float64(busy-s.busy0) / float64(wall)
	}
	if self, err := cpuTime(os.Getpid()); err == nil && wall > 0 {
		s.selfPercent = 100 * float64(self-s.self0) / float64(wall)
	}
	return out
}

// machineBusy returns the CPU time all cores have spent not idle (the "cpu" line of
// /proc/stat without idle and iowait).
func machineBusy() (time.Duration, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, errors.New("empty /proc/stat")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, errors.New("bad /proc/stat")
	}
	var busy int64
	// user nice system idle iowait irq softirq steal
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / clkTck, nil
}
