package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sparesScenario names the rows of the crash-recovery-with-a-spare runs.
const sparesScenario = "spare"

// spareStart is how long the app of the spare runs takes to start: long
// enough that a restart is what the recovery waits for.
const spareStart = time.Second

// Names of the systems of the spare runs.
const (
	sysDeploydSpare0 = "deployd, spares = 0"
	sysDeploydSpare1 = "deployd, spares = 1"
)

// spareSystem is a crashable system whose serving workers (not its spares)
// the run kills.
type spareSystem interface {
	system
	// serving returns the pids of the workers that get connections.
	serving(ctx context.Context) ([]int, error)
	// settle returns once the system is back to its full set of workers
	// (spares included), after a kill.
	settle(ctx context.Context) error
}

func (s *deploydSystem) serving(ctx context.Context) ([]int, error) {
	st, err := s.status(ctx)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, w := range st.Apps[0].Workers {
		if !w.Spare && w.State == "ready" {
			pids = append(pids, w.PID)
		}
	}
	return pids, nil
}

func (s *deploydSystem) settle(ctx context.Context) error { return s.waitReady(ctx, time.Minute) }

func (s *pm2System) serving(ctx context.Context) ([]int, error) {
	m, err := s.slots(ctx)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, pid := range m {
		pids = append(pids, pid)
	}
	return pids, nil
}

func (s *pm2System) settle(ctx context.Context) error {
	if err := s.ensurePoller(); err != nil {
		return err
	}
	n := s.app.instances
	_, err := s.poller.wait(ctx, time.Minute, func(ps []pm2Proc) bool { return len(ps) == n && allOnline(ps) })
	return err
}

// sparesRecovery SIGKILLs each serving worker of the Node app (1 s start)
// once per repeat and times, as a client sees it, until the pool answers
// from its full number of workers again: deployd with balance = "even"
// and spares = 0 (the slot waits for its restart), with spares = 1 (the
// spare takes the slot's place), and PM2's cluster mode (it forks again).
func (b *bench) sparesRecovery(ctx context.Context) error {
	for rep := range b.repeats {
		b.logf("crash recovery with a spare, repeat %d/%d", rep+1, b.repeats)
		app := appSpec{kind: "node", instances: b.instances, startupDelay: spareStart, balance: "even"}
		one := app
		one.spares = 1
		ss := []spareSystem{
			&deploydSystem{b: b, label: sysDeploydSpare0, app: app},
			&deploydSystem{b: b, label: sysDeploydSpare1, app: one},
		}
		if b.pm2 != "" {
			ss = append(ss, &pm2System{b: b, app: appSpec{kind: "node", instances: b.instances, startupDelay: spareStart}})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error {
				for k := range b.instances {
					if err := sys.settle(ctx); err != nil {
						return err
					}
					pids, err := sys.serving(ctx)
					if err != nil {
						return err
					}
					if len(pids) != b.instances {
						return fmt.Errorf("%s: serving workers %v, want %d", sys.name(), pids, b.instances)
					}
					old := pids[k]
					t0 := time.Now()
					if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
						return err
					}
					d, failed, err := b.fullStrength(ctx, sys, old, t0)
					if err != nil {
						return err
					}
					b.logf("    %s: worker %d killed, answering from %d workers again after %v (%d probe requests failed)",
						sys.name(), old, b.instances, d.Round(time.Millisecond), failed)
					b.res.add(sparesScenario, sys.name(), "recovery", rep, ms(d))
					b.res.add(sparesScenario, sys.name(), "failed", rep, float64(failed))
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

// fullStrength sends requests one after the other, each on a new
// connection, from t0 on, until b.instances distinct workers other than
// killed have answered; it returns how long that took and how many
// requests failed meanwhile. Both balancers take turns (deployd's "even",
// PM2's round robin), so a worker that gets connections answers within a
// few requests.
func (b *bench) fullStrength(ctx context.Context, sys system, killed int, t0 time.Time) (time.Duration, int, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	defer c.CloseIdleConnections()
	seen := map[int]bool{}
	failed := 0
	for deadline := t0.Add(time.Minute); time.Now().Before(deadline); {
		if ctx.Err() != nil {
			return 0, failed, ctx.Err()
		}
		pid, err := answeringPID(ctx, c, b.url(sys, "/"))
		if err != nil {
			if failed == 0 {
				b.res.note(fmt.Sprintf("%s, %s: %v", sparesScenario, sys.name(), err))
			}
			failed++
			continue
		}
		if pid != killed {
			seen[pid] = true
		}
		if len(seen) == b.instances {
			return time.Since(t0), failed, nil
		}
	}
	return 0, failed, fmt.Errorf("%s: fewer than %d workers answered within a minute of the SIGKILL (answered: %v)",
		sys.name(), b.instances, seen)
}

// answeringPID is one GET; it returns the pid="P" of the answer.
func answeringPID(ctx context.Context, c *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	for _, f := range strings.Fields(string(body)) {
		if v, ok := strings.CutPrefix(f, "pid="); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no pid in %q", body)
}

func (b *bench) reportSpares(w io.Writer) {
	r := &b.res
	if len(r.vals(sparesScenario, sysDeploydSpare1, "recovery")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Crash recovery with a spare (app start %v, SIGKILL of a serving worker → answering from %d workers again)\n\n",
		spareStart, b.instances)
	t := &table{head: []string{"system", "samples", "ms, min – median – max", "probe requests failed"}}
	for _, sys := range []string{sysPM2, sysDeploydSpare0, sysDeploydSpare1} {
		vs := r.vals(sparesScenario, sys, "recovery")
		if len(vs) == 0 {
			continue
		}
		t.row(sys, fmt.Sprint(len(vs)), mmm(vs, "%.0f"), fmt.Sprintf("%.0f", sum(r.vals(sparesScenario, sys, "failed"))))
	}
	fmt.Fprintln(w, t)
	fmt.Fprintf(w, "Observed as a client: requests one after the other, each on a new connection, until %d distinct "+
		"workers other than the killed one have answered. deployd runs `balance = \"even\"`; PM2 cluster mode "+
		"(its primary hands connections out in turn, `wait_ready`).\n", b.instances)
	if vs := r.ratio(sparesScenario, sysDeploydSpare1, "recovery", sparesScenario, sysPM2, "recovery"); len(vs) > 0 {
		fmt.Fprintf(w, "deployd with a spare / PM2 (per-repeat medians): %s.\n", mmm(vs, "%.3f"))
	}
	fmt.Fprintln(w)
}
