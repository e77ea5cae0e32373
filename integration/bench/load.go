package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/integration/loadgen"
)

// The load generator runs in a child process (this binary again, with loadEnv set to
// its spec): it can be pinned to a CPU, its own CPU use is measured apart from the
// harness's, and the harness stays free to poll and reload while the load runs.
const loadEnv = "DEPLOYD_BENCH_LOADGEN"

// loadSpec is what one load child runs: several loads at once, until each one's bounds
// or until its stdin is closed.
type loadSpec struct {
	Loads []loadOpts
	CPUs  []int // pin to these CPUs; empty = not pinned
}

// loadOpts is the JSON form of loadgen.Options (Check is always the default).
type loadOpts struct {
	URL         string
	Clients     int
	KeepAlive   bool
	MaxRequests int
	MaxDuration time.Duration
	Timeout     time.Duration
}

// loadResult is what a load child reports.
type loadResult struct {
	Results []loadgen.Result
	CPU     time.Duration // the child's user+system CPU time
	Wall    time.Duration
	Pinned  string // the affinity it ran with
}

// runLoadChild is the child's main: it returns the exit code.
func runLoadChild(specJSON string) int {
	var spec loadSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "load child: spec: %v\n", err)
		return 2
	}
	pinned := "all CPUs"
	if len(spec.CPUs) > 0 {
		if err := pinAllThreads(spec.CPUs); err != nil {
			fmt.Fprintf(os.Stderr, "load child: pin: %v\n", err)
			return 1
		}
		runtime.GOMAXPROCS(len(spec.CPUs))
		pinned = fmt.Sprintf("CPUs %v", spec.CPUs)
	}
	t0 := time.Now()
	var loads []*loadgen.Load
	for _, o := range spec.Loads {
		l, err := loadgen.Start(context.Background(), loadgen.Options{
			URL: o.URL, Clients: o.Clients, KeepAlive: o.KeepAlive,
			MaxRequests: o.MaxRequests, MaxDuration: o.MaxDuration, Timeout: o.Timeout,
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "load child: %v\n", err)
			return 2
		}
		loads = append(loads, l)
	}
	// The parent closes our stdin to stop the load early (or dies: same EOF).
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	out := loadResult{Pinned: pinned}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out.Results = make([]loadgen.Result, len(loads))
	for i, l := range loads {
		wg.Go(func() {
			select {
			case <-l.Done():
			case <-eof:
			}
			r := l.Stop()
			mu.Lock()
			out.Results[i] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	out.Wall = time.Since(t0)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}

// pinAllThreads sets the CPU affinity of every thread of this process; threads created
// later inherit it from their creator.
func pinAllThreads(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}

// runningLoad is a load child the harness started.
type runningLoad struct {
	p     *proc
	stdin io.WriteCloser
	out   *os.File

	once sync.Once
	res  loadResult // set once
	err  error
}

// startLoad starts a load child running spec.
func (b *bench) startLoad(spec loadSpec) (*runningLoad, error) {
	spec.CPUs = b.loadCPUs
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	out, err := os.CreateTemp(b.dir, "load-*.json")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), loadEnv+"="+string(js))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		out.Close()
		return nil, err
	}
	cmd.Stdout = out
	p, err := startProc("load", cmd, filepath.Join(b.dir, "load.log"), false)
	if err != nil {
		out.Close()
		return nil, err
	}
	return &runningLoad{p: p, stdin: stdin, out: out}, nil
}

// wait waits for the child to end by its bounds (or ctx: then it is stopped) and
// returns its result.
func (l *runningLoad) wait(ctx context.Context) (loadResult, error) {
	select {
	case <-l.p.done:
	case <-ctx.Done():
	}
	return l.stop()
}

// stop ends the load now and returns its result. Safe to call twice.
func (l *runningLoad) stop() (loadResult, error) {
	l.once.Do(func() { l.res, l.err = l.collect() })
	return l.res, l.err
}

func (l *runningLoad) collect() (loadResult, error) {
	l.stdin.Close()
	select {
	case <-l.p.done:
	case <-time.After(30 * time.Second): // in-flight requests are bounded by their Timeout
		_ = l.p.stop(syscall.SIGKILL, time.Second)
	}
	defer l.out.Close()
	var r loadResult
	if l.p.err != nil {
		return r, fmt.Errorf("load child: %w", l.p.err)
	}
	if _, err := l.out.Seek(0, io.SeekStart); err != nil {
		return r, err
	}
	if err := json.NewDecoder(l.out).Decode(&r); err != nil {
		return r, fmt.Errorf("load child result: %w", err)
	}
	return r, nil
}

// runLoad runs one load to its end and returns its single result.
func (b *bench) runLoad(ctx context.Context, o loadOpts) (loadgen.Result, loadResult, error) {
	l, err := b.startLoad(loadSpec{Loads: []loadOpts{o}})
	if err != nil {
		return loadgen.Result{}, loadResult{}, err
	}
	r, err := l.wait(ctx)
	if err != nil {
		return loadgen.Result{}, r, err
	}
	if ctx.Err() != nil {
		return loadgen.Result{}, r, ctx.Err()
	}
	return r.Results[0], r, nil
}
