package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// reloadSteps is where one `deployd reload` spent its time, from the CLI's
// exec and exit (the harness's clock) and the agent's debug log (its
// "operation started/step/done" lines, ms timestamps, same clock).
type reloadSteps struct {
	// cliToOp: the CLI's exec until the agent starts the operation's
	// stream: the CLI's start, its request, the config re-read.
	cliToOp time.Duration
	// prepared: of cliToOp, the agent's part: request received until the
	// stream starts (config re-read, checks).
	prepared time.Duration
	// agent: the agent's own steps: operation start → first spawn, each
	// old worker's exit → next spawn, last exit → operation done.
	agent time.Duration
	// agentParts are agent's parts in order (for the harness's log).
	agentParts []time.Duration
	// spawnReady, drain: per slot, new worker started → ready, old one's
	// stop sent → exited; swap: ready → stop sent.
	spawnReady, drain, swap []time.Duration
	// opToExit: the operation done until the CLI has exited.
	opToExit time.Duration
}

// logLine is one line of the agent's JSON log as far as the steps need it.
type logLine struct {
	Time     string `json:"@timestamp"`
	Message  string `json:"@message"`
	Op       string `json:"op"`
	Event    string `json:"event"`
	Worker   int    `json:"worker"`
	PID      int    `json:"pid"`
	Prepared int64  `json:"prepared_us"`
}

// agentTimeFormat is the agent's log time format (cli/agent.go).
const agentTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// parseSteps reads the agent log from off for the steps of the reload that
// the CLI ran from t0 to t1. It returns the offset after what it read.
func parseSteps(path string, off int64, t0, t1 time.Time) (*reloadSteps, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, off, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, off, err
	}
	st := &reloadSteps{}
	var opStart, opDone, last time.Time
	started := map[int]time.Time{} // by pid
	stopSent := map[int]time.Time{}
	readyAt := map[int]time.Time{} // by slot: the new worker's ready
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := off
	for sc.Scan() {
		n += int64(len(sc.Bytes())) + 1
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Op != "reload" {
			continue
		}
		at, err := time.Parse(agentTimeFormat, l.Time)
		if err != nil {
			continue
		}
		switch {
		case l.Message == "operation started":
			opStart, last = at, at
			st.prepared = time.Duration(l.Prepared) * time.Microsecond
		case l.Message == "operation done" || l.Message == "operation not done":
			opDone = at
			st.agent += at.Sub(last)
			st.agentParts = append(st.agentParts, at.Sub(last))
		case l.Message != "operation step":
		case l.Event == "started":
			started[l.PID] = at
			st.agent += at.Sub(last)
			st.agentParts = append(st.agentParts, at.Sub(last))
		case l.Event == "ready":
			st.spawnReady = append(st.spawnReady, at.Sub(started[l.PID]))
			readyAt[l.Worker] = at
		case l.Event == "draining":
			stopSent[l.PID] = at
			st.swap = append(st.swap, at.Sub(readyAt[l.Worker]))
		case l.Event == "exited":
			if s, ok := stopSent[l.PID]; ok {
				st.drain = append(st.drain, at.Sub(s))
				last = at
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, off, err
	}
	if opStart.IsZero() || opDone.IsZero() {
		return nil, n, fmt.Errorf("agent log %s: no reload operation started and done after offset %d", path, off)
	}
	st.cliToOp, st.opToExit = opStart.Sub(t0), t1.Sub(opDone)
	return st, n, nil
}

// stepsScenario is the scenario of the steps of reload scenario scn.
func stepsScenario(scn string) string { return scn + ", steps" }

// addSteps records the steps of one reload of reload scenario scn, in ms.
func (b *bench) addSteps(scn, sys string, rep int, st *reloadSteps) {
	b.logf("    %s: steps: CLI→op %v (agent's part %v), agent %v %v, spawn→ready %v, swap %v, drain %v, done→CLI exit %v",
		sys, st.cliToOp.Round(time.Millisecond), st.prepared.Round(100*time.Microsecond), st.agent, st.agentParts, st.spawnReady,
		st.swap, st.drain, st.opToExit.Round(time.Millisecond))
	scn = stepsScenario(scn)
	b.res.add(scn, sys, "cli_to_op", rep, ms(st.cliToOp))
	b.res.add(scn, sys, "prepared", rep, ms(st.prepared))
	b.res.add(scn, sys, "agent", rep, ms(st.agent))
	b.res.add(scn, sys, "op_to_exit", rep, ms(st.opToExit))
	for _, d := range st.spawnReady {
		b.res.add(scn, sys, "spawn_ready", rep, ms(d))
	}
	for _, d := range st.drain {
		b.res.add(scn, sys, "drain", rep, ms(d))
	}
	for _, d := range st.swap {
		b.res.add(scn, sys, "swap", rep, ms(d))
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// reportSteps writes where deployd's reloads spent their time beside the
// floor's parts: per slot (min – median – max over every slot of every
// reload) and per reload.
func (b *bench) reportSteps(w io.Writer) {
	r := &b.res
	t := &table{head: []string{"app startup", "system", "per slot: spawn → ready, ms", "ready → old stop sent, ms",
		"drain (stop sent → exit), ms", "per reload: CLI exec → operation started, ms", "of which in the agent, ms",
		"agent's own steps, ms", "done → CLI exit, ms"}}
	for _, delay := range []time.Duration{0, b.slowStart} {
		scn := stepsScenario(reloadScenario(delay))
		if delay == 0 && len(r.vals("floor parts", sysFloor, "startup_s")) > 0 {
			t.row(delay.String(), "floor (by hand)", mmm(scale(r.vals("floor parts", sysFloor, "startup_s"), 1e-3), "%.0f"),
				"–", mmm(scale(r.vals("floor parts", sysFloor, "drain_s"), 1e-3), "%.0f"), "–", "–", "–", "–")
		}
		if len(r.vals(scn, sysDeployd, "cli_to_op")) == 0 {
			continue
		}
		v := func(m, f string) string { return mmm(r.vals(scn, sysDeployd, m), f) }
		t.row(delay.String(), "deployd", v("spawn_ready", "%.0f"), v("swap", "%.0f"), v("drain", "%.0f"),
			v("cli_to_op", "%.0f"), v("prepared", "%.1f"), v("agent", "%.0f"), v("op_to_exit", "%.0f"))
	}
	if len(t.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "Where the reloads' time went (deployd: the agent's debug log, ms timestamps, and the CLI's exec and exit; "+
		"agent's own steps: operation start → first spawn, each old worker's exit → next spawn, last exit → done):\n\n")
	fmt.Fprintln(w, t)
}
