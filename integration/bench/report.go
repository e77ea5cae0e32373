package main

import (
	"fmt"
	"io"
	"slices"
	"time"
)

const mib = 1 << 20

// report writes the results as Markdown.
func (b *bench) report(w io.Writer) {
	b.reportSettings(w)
	b.reportThroughput(w)
	b.reportReloads(w)
	b.reportUpgrades(w)
	b.reportKills(w)
	b.reportCost(w)
	b.reportCrash(w)
	b.reportCrashLoop(w)
	b.reportSpares(w)
	b.reportMemory(w)
	b.goals(w)
	if len(b.res.notes) > 0 {
		fmt.Fprintf(w, "Notes from the run (distinct failure messages and anomalies):\n\n")
		for _, n := range b.res.notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
		fmt.Fprintln(w)
	}
}

func (b *bench) reportSettings(w io.Writer) {
	fmt.Fprintf(w, "Measured %s on %s. Command: `%s`.\n\n", b.started.UTC().Format("2006-01-02 15:04 MST"), b.machine, b.command)
	fmt.Fprintf(w, "Settings (values are min – median – max over repeats unless marked):\n\n")
	fmt.Fprintf(w, "- %d repeats; %d workers per app (one per core); load: %d keep-alive clients, every response checked.\n",
		b.repeats, b.instances, b.clients)
	fmt.Fprintf(w, "- Throughput: in each repeat all systems run at once (idle when not measured); each gets %v of warm-up "+
		"per endpoint, then %v of load in %v slices, round-robin over the systems with the order rotated every round; "+
		"a repeat's figure is the median over its slices.\n", b.warmup, b.duration, b.slice)
	fmt.Fprintf(w, "- Reloads: %d per run under the %d keep-alive clients plus %d clients opening a new connection per request; "+
		"the %v-startup runs are repeated %d times.\n", b.reloads, b.clients, b.freshClients, b.slowStart, b.slowRepeats)
	fmt.Fprintf(w, "- Load generator: %s.\n", b.loadWhere())
	fmt.Fprintf(w, "- Before each throughput endpoint and each reload or crash run the harness waits up to %v for the rest "+
		"of the machine to use less than %.0f%% of a core.\n\n", b.quietWait, b.quietBusy)
	if b.pm2 == "" {
		fmt.Fprintf(w, "**PM2 rows skipped: %s.**\n\n", b.pm2Skip)
	}
}

func (b *bench) reportThroughput(w io.Writer) {
	nodeSys := []string{sysNode1, sysFloor, sysPM2, sysDeployd}
	for _, ep := range []string{"hello", "cpu"} {
		scn := "throughput " + ep
		what := "`GET /` (hello)"
		if ep == "cpu" {
			what = "`GET /cpu` (fib(29), ~5 ms of CPU)"
		}
		fmt.Fprintf(w, "### Throughput and latency, Node app, %s\n\n", what)
		b.throughputTable(w, scn, nodeSys)
		b.ratioLines(w, scn, [][2]string{{sysDeployd, sysPM2}, {sysDeployd, sysFloor}, {sysPM2, sysFloor}, {sysFloor, sysNode1}})
	}
	fmt.Fprintf(w, "### Throughput and latency, Go test app, `GET /`\n\n")
	b.throughputTable(w, "throughput hello", []string{sysGo1, sysDeploydGo})
	b.ratioLines(w, "throughput hello", [][2]string{{sysDeploydGo, sysGo1}, {sysDeploydGo, sysDeployd}})
}

func (b *bench) reportReloads(w io.Writer) {
	r := &b.res
	fmt.Fprintf(w, "### Reloads under load (%d reloads per run)\n\n", b.reloads)
	t := &table{head: []string{"app startup", "system", "failed requests, total (per run)", "of which connect errors",
		"requests", "p99 ms keep-alive", "p99 ms new conn.", "max ms", "one reload, s"}}
	for _, delay := range []time.Duration{0, b.slowStart} {
		scn := reloadScenario(delay)
		for _, sys := range []string{sysPM2, sysDeployd, sysFloor} {
			if len(r.vals(scn, sys, "failed")) == 0 {
				continue
			}
			name := sys
			if sys == sysFloor {
				name = "floor (by hand, no manager)"
			}
			t.row(delay.String(), name,
				fmt.Sprintf("**%.0f** (%s)", sum(r.vals(scn, sys, "failed")), mmm(r.vals(scn, sys, "failed"), "%.0f")),
				fmt.Sprintf("%.0f", sum(r.vals(scn, sys, "connect_errors"))),
				fmt.Sprintf("%.0f", sum(r.vals(scn, sys, "requests"))),
				mmm(r.vals(scn, sys, "p99"), "%.1f"), mmm(r.vals(scn, sys, "p99_fresh"), "%.1f"),
				mmm(r.vals(scn, sys, "max"), "%.0f"), mmm(r.vals(scn, sys, "reload_s"), "%.2f"))
		}
	}
	fmt.Fprintln(w, t)

	fmt.Fprintf(w, "### Reload duration against its floor\n\n")
	fmt.Fprintf(w, "Floor = slots × (startup + drain), from the by-hand rolling replace of each repeat: the median "+
		"over its reloads of each reload's sum (startup %s s, drain %s s, medians per slot; the %v app adds %v to startup). "+
		"Ratios: median reload of a run / that repeat's floor.\n\n",
		med(r.vals("floor parts", sysFloor, "startup_s"), "%.3f"), med(r.vals("floor parts", sysFloor, "drain_s"), "%.3f"),
		b.slowStart, b.slowStart)
	t = &table{head: []string{"app startup", "floor, s", "deployd, s", "deployd / floor", "pm2, s", "pm2 / floor", "deployd / pm2"}}
	for _, delay := range []time.Duration{0, b.slowStart} {
		scn := reloadScenario(delay)
		floors := b.floors(delay)
		t.row(delay.String(), mmm(mapVals(floors), "%.2f"),
			mmm(r.vals(scn, sysDeployd, "reload_s"), "%.2f"), mmm(perRepRatio(r.perRep(scn, sysDeployd, "reload_s"), floors), "%.2f"),
			mmm(r.vals(scn, sysPM2, "reload_s"), "%.2f"), mmm(perRepRatio(r.perRep(scn, sysPM2, "reload_s"), floors), "%.2f"),
			mmm(r.ratio(scn, sysDeployd, "reload_s", scn, sysPM2, "reload_s"), "%.2f"))
	}
	fmt.Fprintln(w, t)
	b.reportSteps(w)
}

func (b *bench) reportCost(w io.Writer) {
	r := &b.res
	fmt.Fprintf(w, "### Cost of the manager (same %d Node workers)\n\n", b.instances)
	t := &table{head: []string{"manager", "RSS idle, MiB", "RSS under hello load, MiB", "CPU % of a core, hello load",
		"CPU %, cpu load", "workers' RSS, MiB (hello)"}}
	for _, s := range []struct{ sys, name string }{{sysDeployd, "deployd agent"}, {sysPM2, "PM2 daemon (God, cluster primary)"}, {sysDeploydGo, "deployd agent (Go workers)"}} {
		if len(r.vals("cost", s.sys, "idle_rss")) == 0 {
			continue
		}
		t.row(s.name, mmm(scale(r.vals("cost", s.sys, "idle_rss"), mib), "%.1f"),
			mmm(scale(r.vals("throughput hello", s.sys, "manager_rss"), mib), "%.1f"),
			mmm(r.vals("throughput hello", s.sys, "manager_cpu"), "%.1f"),
			mmm(r.vals("throughput cpu", s.sys, "manager_cpu"), "%.1f"),
			mmm(scale(r.vals("throughput hello", s.sys, "workers_rss"), mib), "%.0f"))
	}
	fmt.Fprintln(w, t)
	fmt.Fprintf(w, "deployd agent RSS / PM2 daemon RSS under hello load: %s (idle: %s).\n\n",
		mmm(r.ratio("throughput hello", sysDeployd, "manager_rss", "throughput hello", sysPM2, "manager_rss"), "%.2f"),
		mmm(r.ratio("cost", sysDeployd, "idle_rss", "cost", sysPM2, "idle_rss"), "%.2f"))
}

func (b *bench) reportCrashLoop(w io.Writer) {
	r := &b.res
	if len(r.vals("crash loop", sysDeployd, "total")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Crash loop (slot 0 killed again as soon as its replacement is ready, %d times)\n\n", crashLoopKills)
	head := []string{"system"}
	for k := range crashLoopKills {
		head = append(head, fmt.Sprintf("crash %d, ms", k+1))
	}
	t := &table{head: append(head, "all, s")}
	for _, sys := range []string{sysDeployd, sysPM2} {
		if len(r.vals("crash loop", sys, "total")) == 0 {
			continue
		}
		row := []string{sys}
		for k := range crashLoopKills {
			row = append(row, med(r.vals("crash loop", sys, fmt.Sprintf("recovery_%d", k+1)), "%.0f"))
		}
		t.row(append(row, med(scale(r.vals("crash loop", sys, "total"), 1000), "%.2f"))...)
	}
	fmt.Fprintln(w, t)
	fmt.Fprintf(w, "Medians over repeats. Crash 1 is isolated (the worker had been up over stable_after, 1 s); "+
		"each later one is of a worker up for less, a crash loop: deployd waits backoff (100 ms, doubling, ±20 %%) "+
		"before the restart, PM2 (restart_delay 0) restarts at once and stops after max_restarts (15) unstable restarts.\n\n")
}

func (b *bench) reportCrash(w io.Writer) {
	r := &b.res
	if len(r.vals("crash", sysDeployd, "recovery")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Crash recovery (SIGKILL of a worker → replacement ready)\n\n")
	t := &table{head: []string{"system", "samples", "ms, min – median – max", "how it was observed"}}
	t.row(sysDeployd, fmt.Sprint(len(r.vals("crash", sysDeployd, "recovery"))), mmm(r.vals("crash", sysDeployd, "recovery"), "%.0f"),
		"`deployd status --json` polled back to back (slot has a new pid in state ready)")
	if b.pm2 != "" {
		t.row(sysPM2, fmt.Sprint(len(r.vals("crash", sysPM2, "recovery"))), mmm(r.vals("crash", sysPM2, "recovery"), "%.0f"),
			"pm2's API `list()` polled every 5 ms (pm_id online with a new pid)")
	}
	fmt.Fprintln(w, t)
	if vs := r.ratio("crash", sysDeployd, "recovery", "crash", sysPM2, "recovery"); len(vs) > 0 {
		fmt.Fprintf(w, "deployd / pm2 (per-repeat medians): %s. Each killed worker had been up over stable_after "+
			"(1 s), so both restart it at once (deployd: an isolated crash; PM2: restart_delay 0).\n\n", mmm(vs, "%.2f"))
	}
}

func (b *bench) throughputTable(w io.Writer, scn string, systems []string) {
	r := &b.res
	t := &table{head: []string{"system", "req/s", "p50 ms", "p99 ms", "failed", "manager CPU %", "workers CPU %",
		"server CPU ms per 1000 req.", "busiest worker's share", "load generator CPU %", "other jobs' CPU %"}}
	for _, sys := range systems {
		if len(r.vals(scn, sys, "rps")) == 0 {
			continue
		}
		t.row(sysLabel(sys, b.instances), mmm(r.vals(scn, sys, "rps"), "%.0f"), mmm(r.vals(scn, sys, "p50"), "%.2f"),
			mmm(r.vals(scn, sys, "p99"), "%.2f"), fmt.Sprintf("%.0f", sum(r.vals(scn, sys, "errors"))),
			med(r.vals(scn, sys, "manager_cpu"), "%.0f"), med(r.vals(scn, sys, "workers_cpu"), "%.0f"),
			mmm(b.cpuPerK(scn, sys), "%.1f"), med(r.vals(scn, sys, "busiest_share"), "%.2f"), med(r.vals(scn, sys, "loadgen_cpu"), "%.0f"),
			mmm(r.vals(scn, sys, "other_cpu"), "%.0f"))
	}
	fmt.Fprintln(w, t)
}

func (b *bench) ratioLines(w io.Writer, scn string, pairs [][2]string) {
	for _, p := range pairs {
		if vs := b.res.ratio(scn, p[0], "rps", scn, p[1], "rps"); len(vs) > 0 {
			fmt.Fprintf(w, "- req/s %s / %s: %s\n", p[0], p[1], mmm(vs, "%.3f"))
		}
	}
	for _, p := range pairs {
		if vs := perRepRatio(b.cpuPerKByRep(scn, p[0]), b.cpuPerKByRep(scn, p[1])); len(vs) > 0 {
			fmt.Fprintf(w, "- server CPU per request %s / %s: %s\n", p[0], p[1], mmm(vs, "%.3f"))
		}
	}
	fmt.Fprintln(w)
}

func sysLabel(sys string, n int) string {
	switch sys {
	case sysNode1:
		return "one plain Node process"
	case sysFloor:
		return fmt.Sprintf("floor: %d Node processes on one inherited socket, no manager", n)
	case sysPM2:
		return fmt.Sprintf("PM2 cluster mode, -i %d", n)
	case sysDeployd:
		return fmt.Sprintf("deployd, %d workers (ready = node-ipc)", n)
	case sysGo1:
		return "one plain Go process"
	case sysDeploydGo:
		return fmt.Sprintf("deployd, %d Go workers (ready = notify)", n)
	}
	return sys
}

// floors returns the reload floor per repeat for an app with the given extra
// startup: the median over the repeat's by-hand reloads of that reload's
// Σ slots (startup + drain), plus slots × delay. A median of whole reloads,
// like deployd's and PM2's figures: slots × (median startup + median drain)
// is lower when the startups are skewed (0.72 s against 0.79 s for the
// same reloads in the run of 2026-12-02 03:55), which made the ratios
// unfair to the managers.
func (b *bench) floors(delay time.Duration) map[int]float64 {
	out := map[int]float64{}
	for rep, s := range b.res.perRep("floor parts", sysFloor, "reload_s") {
		out[rep] = s + float64(b.instances)*delay.Seconds()
	}
	return out
}

func perRepRatio(a, b map[int]float64) []float64 {
	var out []float64
	for rep, va := range a {
		if vb, ok := b[rep]; ok && vb > 0 {
			out = append(out, va/vb)
		}
	}
	return out
}

func mapVals(m map[int]float64) []float64 {
	var out []float64
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func scale(vs []float64, d float64) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = v / d
	}
	return out
}

// goals writes the goals table: a goal holds when the median over repeats meets it.
func (b *bench) goals(w io.Writer) {
	r := &b.res
	fmt.Fprintf(w, "### Goals\n\n")
	t := &table{head: []string{"goal", "measured (min – median – max)", "holds?"}}
	ratioGoal := func(name string, vs []float64, want float64, ge bool) {
		if len(vs) == 0 {
			t.row(name, "not measured", "–")
			return
		}
		m := median(vs)
		ok := m >= want
		all := slices.Min(vs) >= want
		if !ge {
			ok, all = m <= want, slices.Max(vs) <= want
		}
		verdict := "no"
		switch {
		case ok && all:
			verdict = "**yes**, in every repeat"
		case ok:
			verdict = "yes by the median, not in every repeat"
		case !ok && (ge && slices.Max(vs) >= want || !ge && slices.Min(vs) <= want):
			verdict = "**no** by the median (met in some repeats)"
		default:
			verdict = "**no**"
		}
		t.row(name, mmm(vs, "%.3f"), verdict)
	}
	ratioGoal("hello req/s deployd ≥ 1.15 × PM2 cluster", r.ratio("throughput hello", sysDeployd, "rps", "throughput hello", sysPM2, "rps"), 1.15, true)
	ratioGoal("hello req/s deployd ≥ 0.97 × floor", r.ratio("throughput hello", sysDeployd, "rps", "throughput hello", sysFloor, "rps"), 0.97, true)
	for _, delay := range []time.Duration{0, b.slowStart} {
		vs := r.vals(reloadScenario(delay), sysDeployd, "failed")
		if len(vs) == 0 {
			t.row(fmt.Sprintf("0 failed requests, deployd reloads, startup %v", delay), "not measured", "–")
			continue
		}
		verdict := "**yes**"
		if sum(vs) > 0 {
			verdict = "**no**"
		}
		t.row(fmt.Sprintf("0 failed requests, deployd reloads, startup %v", delay),
			fmt.Sprintf("%.0f failed in %d runs of %d reloads", sum(vs), len(vs), b.reloads), verdict)
	}
	// The agent's RSS with 2 apps and metrics on, idle, against PM2's daemon
	// with the same apps: the agent's higher reading (the later one shows an
	// idle loop's garbage) over the daemon's lower one, per repeat.
	ratioGoal(fmt.Sprintf("agent RSS ≤ ¼ PM2 daemon RSS, idle, 2 apps × %d Node workers (agent's higher idle reading / daemon's lower)", b.instances),
		idleRatios(r), 0.25, false)
	ratioGoal("agent RSS ≤ ¼ PM2 daemon RSS (under hello load)",
		r.ratio("throughput hello", sysDeployd, "manager_rss", "throughput hello", sysPM2, "manager_rss"), 0.25, false)
	fmt.Fprintln(w, t)
}

// idleRatios is, per repeat of the memory phase, the agent's higher idle
// RSS reading over PM2's daemon's lower one; none when a reading is missing.
func idleRatios(r *results) []float64 {
	reading := func(sys string, pick func(a, b float64) float64) []float64 {
		idle, later := r.vals("memory", sys, "idle_rss"), r.vals("memory", sys, "idle_later_rss")
		if len(later) != len(idle) {
			return idle
		}
		out := make([]float64, len(idle))
		for i := range idle {
			out[i] = pick(idle[i], later[i])
		}
		return out
	}
	agent := reading(sysDeployd, func(a, b float64) float64 { return max(a, b) })
	pm2 := reading(sysPM2, func(a, b float64) float64 { return min(a, b) })
	if len(agent) != len(pm2) {
		return nil
	}
	var out []float64
	for i := range agent {
		if pm2[i] > 0 {
			out = append(out, agent[i]/pm2[i])
		}
	}
	return out
}

// cpuPerK returns, per repeat, the CPU time the workers and the manager spent per 1000
// requests, in ms: what a request costs the server side whoever limits the rate.
func (b *bench) cpuPerK(scn, sys string) []float64 { return mapVals(b.cpuPerKByRep(scn, sys)) }

func (b *bench) cpuPerKByRep(scn, sys string) map[int]float64 {
	rps := b.res.perRep(scn, sys, "rps")
	wcpu := b.res.perRep(scn, sys, "workers_cpu")
	mcpu := b.res.perRep(scn, sys, "manager_cpu")
	out := map[int]float64{}
	for rep, n := range rps {
		w, ok := wcpu[rep]
		if !ok || n <= 0 {
			continue
		}
		// % of a core = 10 ms of CPU per second; per 1000 requests: × 1000 / n.
		out[rep] = (w + mcpu[rep]) * 10 * 1000 / n
	}
	return out
}
