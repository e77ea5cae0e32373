package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/deployd/deployd/integration/loadgen"
)

// maxRequests bounds every load by count as well as by time.
const maxRequests = 50_000_000

// rotate returns xs starting at index r (mod len): repeat r runs the systems in another
// order, so that drift over the run hits each of them in every position.
func rotate[T any](xs []T, r int) []T {
	if len(xs) == 0 {
		return xs
	}
	r %= len(xs)
	return append(append([]T(nil), xs[r:]...), xs[:r]...)
}

// withSystem starts sys, runs f, and stops sys whatever happens.
func (b *bench) withSystem(ctx context.Context, sys system, f func() error) (err error) {
	b.waitQuiet(ctx, sys.name())
	b.logf("  %s: starting", sys.name())
	defer func() {
		if serr := sys.stop(); serr != nil {
			b.logf("  %s: stop: %v", sys.name(), serr)
			err = errors.Join(err, serr)
		}
	}()
	if err := sys.start(ctx); err != nil {
		return fmt.Errorf("%s: start: %w", sys.name(), err)
	}
	return f()
}

func (b *bench) url(sys system, path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", sys.port(), path)
}

// Names of the systems in the results.
const (
	sysNode1     = "node ×1"
	sysFloor     = "floor"
	sysPM2       = "pm2"
	sysDeployd   = "deployd"
	sysGo1       = "go ×1"
	sysDeploydGo = "deployd-go"
)

func endpointName(path string) string {
	if path == "/" {
		return "hello"
	}
	return path[1:]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadCPU is the load generator's CPU use in % of one core.
func loadCPU(lr loadResult) float64 {
	if lr.Wall <= 0 {
		return 0
	}
	return 100 * float64(lr.CPU) / float64(lr.Wall)
}

func (b *bench) addErrors(scn, sys string, r loadgen.Result) {
	for _, e := range r.Errors {
		b.res.note(fmt.Sprintf("%s, %s: %s", scn, sys, e))
	}
}

// crashRecovery kills each worker with SIGKILL once per repeat and times until the
// manager reports its replacement ready.
func (b *bench) crashRecovery(ctx context.Context) error {
	node := appSpec{kind: "node", instances: b.instances}
	for rep := range b.repeats {
		b.logf("crash recovery, repeat %d/%d", rep+1, b.repeats)
		ss := []crashable{&deploydSystem{b: b, label: sysDeployd, app: node}}
		if b.pm2 != "" {
			ss = append(ss, &pm2System{b: b, app: node})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error {
				for slot := range b.instances {
					time.Sleep(time.Second)
					pids, err := sys.slots(ctx)
					if err != nil {
						return err
					}
					old := pids[slot]
					if old <= 0 {
						return fmt.Errorf("%s: no pid for slot %d: %v", sys.name(), slot, pids)
					}
					t0 := time.Now()
					if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
						return err
					}
					if err := sys.waitReplaced(ctx, slot, old); err != nil {
						return err
					}
					d := time.Since(t0)
					b.logf("    %s: slot %d back %v after SIGKILL", sys.name(), slot, d.Round(time.Millisecond))
					b.res.add("crash", sys.name(), "recovery", rep, ms(d))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// crashLoopKills is how many times in a row the crash-loop run kills slot 0.
const crashLoopKills = 5

// crashLoop kills slot 0 with SIGKILL as soon as its replacement is ready,
// crashLoopKills times in a row, and times each recovery: every worker dies
// well within stable_after / min_uptime (1 s) of its start, the crash loop
// that deployd backs off from (backoff 100 ms, doubling) and PM2, with
// restart_delay 0, restarts at once until max_restarts.
func (b *bench) crashLoop(ctx context.Context) error {
	node := appSpec{kind: "node", instances: b.instances}
	for rep := range b.repeats {
		b.logf("crash loop, repeat %d/%d", rep+1, b.repeats)
		ss := []crashable{&deploydSystem{b: b, label: sysDeployd, app: node}}
		if b.pm2 != "" {
			ss = append(ss, &pm2System{b: b, app: node})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error {
				time.Sleep(2 * time.Second) // the first worker has been up for longer than stable_after
				var total time.Duration
				for k := range crashLoopKills {
					pids, err := sys.slots(ctx)
					if err != nil {
						return err
					}
					old := pids[0]
					if old <= 0 {
						return fmt.Errorf("%s: no pid for slot 0: %v", sys.name(), pids)
					}
					t0 := time.Now()
					if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
						return err
					}
					if err := sys.waitReplaced(ctx, 0, old); err != nil {
						return err
					}
					d := time.Since(t0)
					total += d
					b.logf("    %s: crash %d back %v after SIGKILL", sys.name(), k+1, d.Round(time.Millisecond))
					b.res.add("crash loop", sys.name(), fmt.Sprintf("recovery_%d", k+1), rep, ms(d))
				}
				b.res.add("crash loop", sys.name(), "total", rep, ms(total))
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// reloads runs b.reloads reloads under load per system, for an app that starts at once
// and one that needs startupDelay to start.
func (b *bench) reloadsUnderLoad(ctx context.Context) error {
	for rep := range b.repeats {
		for _, delay := range []time.Duration{0, b.slowStart} {
			if delay > 0 && rep >= b.slowRepeats {
				continue
			}
			b.logf("reloads under load, startup %v, repeat %d/%d", delay, rep+1, b.repeats)
			app := appSpec{kind: "node", instances: b.instances, startupDelay: delay}
			ss := []reloader{&deploydSystem{b: b, label: sysDeployd, app: app, steps: true}}
			if b.pm2 != "" {
				ss = append(ss, &pm2System{b: b, app: app})
			}
			if delay == 0 {
				// The floor: a rolling replace by hand, no manager. Its reload time for
				// the slow app is computed: slots × (startup + drain).
				ss = append(ss, &bareSystem{b: b, label: sysFloor, app: app, shared: true})
			}
			for _, sys := range rotate(ss, rep) {
				err := b.withSystem(ctx, sys, func() error { return b.reloadRun(ctx, sys, rep, delay) })
				if err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (b *bench) reloadRun(ctx context.Context, sys reloader, rep int, delay time.Duration) error {
	return b.loadedRun(ctx, sys, rep, reloadScenario(delay), true)
}

// loadedRun runs b.reloads calls of sys.reload under load and records them
// as scenario scn; newVersion: each call moves to a new version (a reload),
// which the last answers must show.
func (b *bench) loadedRun(ctx context.Context, sys reloader, rep int, scn string, newVersion bool) error {
	url := b.url(sys, "/")
	bound := 10 * time.Minute
	load, err := b.startLoad(loadSpec{Loads: []loadOpts{
		{URL: url, Clients: b.clients, KeepAlive: true, MaxRequests: maxRequests, MaxDuration: bound},
		{URL: url, Clients: b.freshClients, KeepAlive: false, MaxRequests: maxRequests, MaxDuration: bound},
	}})
	if err != nil {
		return err
	}
	defer load.stop()
	time.Sleep(time.Second)
	var startups, drains []time.Duration
	version := ""
	for i := range b.reloads {
		version = fmt.Sprintf("v%d", i+2)
		t0 := time.Now()
		if err := sys.reload(ctx, version); err != nil {
			return fmt.Errorf("%s: reload %d: %w", sys.name(), i+1, err)
		}
		d := time.Since(t0)
		if ds, ok := sys.(*deploydSystem); ok {
			// The `deployd reload` command alone: not the config write
			// before it nor the harness's status call after it.
			d = ds.lastCLI
			if ds.lastSteps != nil {
				b.addSteps(scn, ds.name(), rep, ds.lastSteps)
			}
		}
		b.res.add(scn, sys.name(), "reload_s", rep, d.Seconds())
		if f, ok := sys.(*bareSystem); ok {
			startups = append(startups, f.startups...)
			drains = append(drains, f.drains...)
			b.logf("    %s: steps: spawn→ready %v, drain %v", sys.name(), roundAll(f.startups), roundAll(f.drains))
			var sum time.Duration // this reload's slots × (startup + drain)
			for _, d := range append(slices.Clone(f.startups), f.drains...) {
				sum += d
			}
			b.res.add("floor parts", sysFloor, "reload_s", rep, sum.Seconds())
		}
		b.logf("    %s: reload %d to %s took %v", sys.name(), i+1, version, d.Round(time.Millisecond))
	}
	time.Sleep(time.Second)
	lr, err := load.stop()
	if err != nil {
		return err
	}
	ka, fresh := lr.Results[0], lr.Results[1]
	b.logf("    %s: keep-alive clients: %v", sys.name(), ka)
	b.logf("    %s: new-connection clients: %v", sys.name(), fresh)
	b.res.add(scn, sys.name(), "failed_ka", rep, float64(ka.Failures))
	b.res.add(scn, sys.name(), "failed_fresh", rep, float64(fresh.Failures))
	b.res.add(scn, sys.name(), "failed", rep, float64(ka.Failures+fresh.Failures))
	b.res.add(scn, sys.name(), "connect_errors", rep, float64(ka.ConnectErrors+fresh.ConnectErrors))
	b.res.add(scn, sys.name(), "requests", rep, float64(ka.Requests+fresh.Requests))
	b.res.add(scn, sys.name(), "p99", rep, ms(ka.P99))
	b.res.add(scn, sys.name(), "max", rep, ms(max(ka.Max, fresh.Max)))
	b.res.add(scn, sys.name(), "p99_fresh", rep, ms(fresh.P99))
	b.addErrors(scn, sys.name(), ka)
	b.addErrors(scn, sys.name(), fresh)
	if newVersion && ka.Versions[version] == 0 {
		b.res.note(fmt.Sprintf("%s, %s, repeat %d: no answer from the last version %s (versions %v)",
			scn, sys.name(), rep+1, version, ka.Versions))
	}
	for _, d := range startups {
		b.res.add("floor parts", sysFloor, "startup_s", rep, d.Seconds())
	}
	for _, d := range drains {
		b.res.add("floor parts", sysFloor, "drain_s", rep, d.Seconds())
	}
	return nil
}

func reloadScenario(delay time.Duration) string {
	return fmt.Sprintf("reload, startup %v", delay)
}

// waitQuiet waits, at most b.quietWait, until the machine is nearly idle while nothing
// of the benchmark runs: other jobs on a shared machine are the largest source of noise.
// It never fails; a wait that ran out is noted in the report.
func (b *bench) waitQuiet(ctx context.Context, what string) {
	if b.quietWait <= 0 {
		return
	}
	deadline := time.Now().Add(b.quietWait)
	busy := 0.0
	for {
		b0, err := machineBusy()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		b1, err1 := machineBusy()
		if err != nil || err1 != nil {
			return
		}
		busy = 100 * float64(b1-b0) / float64(time.Second)
		if busy <= b.quietBusy {
			return
		}
		if time.Now().After(deadline) {
			b.res.note(fmt.Sprintf("before %s: the machine was still %.0f%% busy (of one core) with other jobs after waiting %v",
				what, busy, b.quietWait))
			return
		}
	}
}
