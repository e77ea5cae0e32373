package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/deployd/deployd/integration/loadgen"
)

// throughputSystems are the ways of running the apps compared for throughput.
func (b *bench) throughputSystems() []system {
	node := appSpec{kind: "node", instances: b.instances}
	ss := []system{
		&bareSystem{b: b, label: sysNode1, app: appSpec{kind: "node", instances: 1}},
		&bareSystem{b: b, label: sysFloor, app: node, shared: true},
		&deploydSystem{b: b, label: sysDeployd, app: node},
		&bareSystem{b: b, label: sysGo1, app: appSpec{kind: "go", instances: 1}},
		&deploydSystem{b: b, label: sysDeploydGo, app: appSpec{kind: "go", instances: b.instances}},
	}
	if b.pm2 != "" {
		ss = append(ss, &pm2System{b: b, app: node})
	}
	return ss
}

// throughput measures requests/s and latency of each system on each endpoint, and the
// CPU and memory of the manager and the workers meanwhile. In each repeat every system
// is started (and idles while not measured), then the load goes to them in slices of
// b.slice, round-robin, the order rotated each round: other work on a shared machine
// hits every system alike. A repeat's figure for a system is the median over its slices
// (failures: the sum).
func (b *bench) throughput(ctx context.Context) error {
	for rep := range b.repeats {
		b.logf("throughput, repeat %d/%d", rep+1, b.repeats)
		ss := rotate(b.throughputSystems(), rep)
		if err := b.withSystems(ctx, ss, func() error { return b.throughputRepeat(ctx, ss, rep) }); err != nil {
			return err
		}
	}
	return nil
}

// withSystems starts every system, runs f, and stops them all whatever happens.
func (b *bench) withSystems(ctx context.Context, ss []system, f func() error) (err error) {
	var started []system
	defer func() {
		for _, sys := range slices.Backward(started) {
			if serr := sys.stop(); serr != nil {
				b.logf("  %s: stop: %v", sys.name(), serr)
				err = errors.Join(err, serr)
			}
		}
	}()
	for _, sys := range ss {
		b.logf("  %s: starting", sys.name())
		started = append(started, sys)
		if err := sys.start(ctx); err != nil {
			return fmt.Errorf("%s: start: %w", sys.name(), err)
		}
	}
	return f()
}

// slice is one measured slice of load on one system.
type slice struct {
	r        loadgen.Result
	loadCPU  float64
	usage    map[int]procUsage
	workers  []int
	mgr      int
	otherCPU float64
}

func (b *bench) throughputRepeat(ctx context.Context, ss []system, rep int) error {
	for _, sys := range ss {
		if mgr := sys.managerPID(); mgr > 0 {
			if r, err := settledRSS(ctx, mgr); err == nil {
				b.res.add("cost", sys.name(), "idle_rss", rep, float64(r))
			}
		}
	}
	rounds := max(1, int(b.duration/b.slice))
	for _, path := range []string{"/", "/cpu"} {
		var eligible []system
		for _, sys := range ss {
			if path == "/" || (sys.name() != sysGo1 && sys.name() != sysDeploydGo) { // the Go app has no /cpu
				eligible = append(eligible, sys)
			}
		}
		for _, sys := range eligible {
			o := loadOpts{URL: b.url(sys, path), Clients: b.clients, KeepAlive: true, MaxRequests: maxRequests, MaxDuration: b.warmup}
			if _, _, err := b.runLoad(ctx, o); err != nil {
				return fmt.Errorf("%s %s warm-up: %w", sys.name(), path, err)
			}
		}
		b.waitQuiet(ctx, "throughput "+path)
		got := map[string][]slice{}
		for round := range rounds {
			for _, sys := range rotate(eligible, round) {
				sl, err := b.measureSlice(ctx, sys, path)
				if err != nil {
					return err
				}
				got[sys.name()] = append(got[sys.name()], sl)
			}
		}
		for _, sys := range eligible {
			b.addSlices("throughput "+endpointName(path), sys.name(), rep, got[sys.name()])
		}
	}
	return nil
}

// measureSlice puts b.slice of load on sys and samples its processes meanwhile.
func (b *bench) measureSlice(ctx context.Context, sys system, path string) (slice, error) {
	sl := slice{workers: sys.workerPIDs(), mgr: sys.managerPID()}
	pids := slices.Clone(sl.workers)
	if sl.mgr > 0 {
		pids = append(pids, sl.mgr)
	}
	sampler := sampleProcs(pids)
	o := loadOpts{URL: b.url(sys, path), Clients: b.clients, KeepAlive: true, MaxRequests: maxRequests, MaxDuration: b.slice}
	r, lr, err := b.runLoad(ctx, o)
	sl.usage = sampler.finish()
	if err != nil {
		return sl, fmt.Errorf("%s %s: %w", sys.name(), path, err)
	}
	sl.r, sl.loadCPU = r, loadCPU(lr)
	ours := sl.loadCPU + sampler.selfPercent
	for _, u := range sl.usage {
		ours += u.CPUPercent
	}
	// CPU used by anything else on the machine meanwhile (other jobs: noise).
	sl.otherCPU = max(0, sampler.busyPercent-ours)
	time.Sleep(100 * time.Millisecond) // let the last connections close
	return sl, nil
}

// addSlices records a repeat's figures for one system from its slices.
func (b *bench) addSlices(scn, sys string, rep int, sls []slice) {
	var rps, p50, p99, lcpu, wcpu, share, mcpu, other []float64
	var failures int64
	var wrss, mrss float64
	for _, sl := range sls {
		rps = append(rps, sl.r.RPS)
		p50 = append(p50, ms(sl.r.P50))
		p99 = append(p99, ms(sl.r.P99))
		lcpu = append(lcpu, sl.loadCPU)
		other = append(other, sl.otherCPU)
		failures += sl.r.Failures
		b.addErrors(scn, sys, sl.r)
		var sum, busiest, rssSum float64
		for _, pid := range sl.workers {
			sum += sl.usage[pid].CPUPercent
			busiest = max(busiest, sl.usage[pid].CPUPercent)
			rssSum += float64(sl.usage[pid].MaxRSS)
		}
		wcpu = append(wcpu, sum)
		wrss = max(wrss, rssSum)
		if len(sl.workers) > 1 && sum > 0 {
			// 1/n: the workers were equally busy; 1: one did all the work.
			share = append(share, busiest/sum)
		}
		if sl.mgr > 0 {
			mcpu = append(mcpu, sl.usage[sl.mgr].CPUPercent)
			mrss = max(mrss, float64(sl.usage[sl.mgr].MaxRSS))
		}
	}
	add := func(metric string, vs []float64) {
		if len(vs) > 0 {
			b.res.add(scn, sys, metric, rep, median(vs))
		}
	}
	add("rps", rps)
	add("p50", p50)
	add("p99", p99)
	add("loadgen_cpu", lcpu)
	add("workers_cpu", wcpu)
	add("busiest_share", share)
	add("manager_cpu", mcpu)
	add("other_cpu", other)
	b.res.add(scn, sys, "errors", rep, float64(failures))
	b.res.add(scn, sys, "workers_rss", rep, wrss)
	if mrss > 0 {
		b.res.add(scn, sys, "manager_rss", rep, mrss)
	}
	b.logf("    %s %s: %.0f req/s, p50 %.2f ms, p99 %.2f ms, %d failed (medians of %d slices; other jobs %.0f%% CPU)",
		sys, scn, median(rps), median(p50), median(p99), failures, len(sls), median(other))
}

// settledRSS returns pid's RSS once it has settled after start: two readings
// 100 ms apart within 64 KiB of each other (or the last reading after 5 s).
func settledRSS(ctx context.Context, pid int) (int64, error) {
	prev, err := rss(pid)
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		var cur int64
		if cur, err = rss(pid); err == nil && max(cur-prev, prev-cur) < 64<<10 {
			return cur, nil
		}
		prev = cur
	}
	return prev, err
}
