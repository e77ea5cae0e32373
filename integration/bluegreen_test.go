package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// timedAnswer is one answered request of cutoverLoads.
type timedAnswer struct {
	sent, got time.Time
	reused    bool
	src, ver  string
	pid       int
}

// cutoverLoads are a keep-alive load and a new-connection load whose
// clients connect from 8 addresses (127.0.0.2-9, one each), every answer
// kept with its times.
type cutoverLoads struct {
	mu       sync.Mutex
	answers  []timedAnswer
	ka, nka  *loadgen.Load
	canceled context.CancelFunc
}

var cutoverSources = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}

func startCutoverLoads(t *testing.T, port int) *cutoverLoads {
	t.Helper()
	holdLoadSlot(t)
	c := &cutoverLoads{}
	observe := func(o loadgen.Observation) {
		if o.Err != nil {
			return // counted in the load's Failures
		}
		a := timedAnswer{sent: o.Sent, got: o.Got, reused: o.Reused, src: o.Source}
		if _, err := fmt.Sscanf(o.Body, "version=%s pid=%d", &a.ver, &a.pid); err != nil {
			return
		}
		c.mu.Lock()
		c.answers = append(c.answers, a)
		c.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.canceled = cancel
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	var err error
	c.ka, err = loadgen.Start(ctx, loadgen.Options{URL: url, Clients: 4, KeepAlive: true,
		MaxRequests: 300_000, MaxDuration: 2 * time.Minute, Observe: observe})
	if err != nil {
		t.Fatal(err)
	}
	c.nka, err = loadgen.Start(ctx, loadgen.Options{URL: url, Clients: len(cutoverSources), Sources: cutoverSources,
		MaxRequests: 300_000, MaxDuration: 2 * time.Minute, Observe: observe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ka.Stop(); c.nka.Stop(); cancel() })
	return c
}

// stopAfter lets each new-connection client get 20 answers sent after
// since (or 20 s pass), then stops both loads and checks they lost nothing.
func (c *cutoverLoads) stopAfter(t *testing.T, since time.Time) []timedAnswer {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n := map[string]int{}
		c.mu.Lock()
		for _, a := range c.answers {
			if a.src != "" && a.sent.After(since) {
				n[a.src]++
			}
		}
		c.mu.Unlock()
		if !slices.ContainsFunc(cutoverSources, func(s string) bool { return n[s] < 20 }) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polls the condition above
	}
	ka, nka := c.ka.Stop(), c.nka.Stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.answers)
	slices.SortFunc(out, func(a, b timedAnswer) int { return a.sent.Compare(b.sent) })
	return out
}

// reloadEvents are the events of a `reload --json`.
func reloadEvents(stdout string) []api.Event {
	var es []api.Event
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var e api.Event
		if json.Unmarshal([]byte(line), &e) == nil && e.Type != "" {
			es = append(es, e)
		}
	}
	return es
}

// TestBlueGreenCutoverOnSteeredPools: with balance even and sticky, a
// blue-green reload v1 → v2 whose workers take 1 s to start (and bake
// min_ready 500 ms) under a keep-alive and a new-connection load: nothing
// fails; while the reload waits, status shows the v2 workers ready and
// spare; no v2 answer came before the cutover event (stamped just before
// the one map update, after every v2 worker was ready), no connection
// opened after the first v1 worker was told to drain reached v1, and each
// client moved once, at that moment (sticky: from one v1 worker to one v2
// worker).
func TestBlueGreenCutoverOnSteeredPools(t *testing.T) {
	needSteering(t)
	for _, balance := range []string{"even", "sticky"} {
		t.Run(balance, func(t *testing.T) {
			port := FreePort(t)
			const instances = 3
			extra := fmt.Sprintf("balance = %q\nmin_ready = \"500ms\"", balance)
			a := StartAgent(t, bins, versionedApp(port, instances, "v1", "", extra))
			st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
			loads := startCutoverLoads(t, port)
			a.WriteConfig(versionedApp(port, instances, "v2", `TESTAPP_STARTUP_DELAY = "1s"`, extra))
			spares := watchSpares(a, appOf(st, "web").Release, instances)
			r := a.CLI("reload", "web", "--strategy", "blue-green", "--json")
			end := time.Now()
			sawSpares := spares()
			answers := loads.stopAfter(t, end)
			if r.Code != 0 {
				t.Fatalf("reload: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
			}
			if !sawSpares {
				t.Errorf("status never showed the %d v2 workers ready and spare beside %d serving v1 workers while the reload waited", instances, instances)
			}
			checkCutover(t, reloadEvents(r.Stdout), answers, balance == "sticky")
		})
	}
}

// watchSpares polls the status while a reload runs; the func it returns
// ends the polling and reports whether a status showed n new workers
// ready and spare while n of release old served.
func watchSpares(a *Agent, old string, n int) func() bool {
	done, seen := make(chan struct{}), make(chan bool, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			ctx, cancel := a.Ctx(StatusTimeout)
			st, err := a.Client.Status(ctx, "web")
			cancel()
			if err == nil && len(st.Apps) == 1 {
				spare, serving := 0, 0
				for _, w := range st.Apps[0].Workers {
					switch {
					case w.Release != old && w.State == "ready" && w.Spare:
						spare++
					case w.Release == old && w.State == "ready" && !w.Spare:
						serving++
					}
				}
				if spare == n && serving == n {
					seen <- true
					return
				}
			}
			select {
			case <-done:
				seen <- false
				return
			case <-tick.C:
			}
		}
	}()
	return func() bool { close(done); return <-seen }
}

// checkCutover checks the answers of the loads through a blue-green
// reload v1 → v2 against its events.
func checkCutover(t *testing.T, events []api.Event, answers []timedAnswer, sticky bool) {
	t.Helper()
	var cut, drain, lastReady time.Time
	for _, e := range events {
		switch {
		case e.Type == api.EventCutover && cut.IsZero():
			cut = e.Time
		case e.Type == api.EventDraining && drain.IsZero():
			drain = e.Time
		case e.Type == api.EventReady && e.Time.After(lastReady):
			lastReady = e.Time
		}
	}
	if drain.IsZero() {
		t.Fatalf("no draining event in %+v", events)
	}
	if cut.IsZero() {
		t.Errorf("no cutover event in %+v", events)
		cut = drain // the checks below still say what answered when
	}
	if cut.Before(lastReady) || drain.Before(cut) {
		t.Errorf("cutover at %s, last v2 ready at %s, first drain at %s: want ready ≤ cutover ≤ drain",
			cut.Format(time.StampMicro), lastReady.Format(time.StampMicro), drain.Format(time.StampMicro))
	}
	var wrong []string
	count := map[string]int{}
	lateV1, lateV1Max := 0, time.Duration(0) // v1 new connections opened after the cutover's stamp, before the drain

	runs := map[string][]timedAnswer{} // per source: the answers where the worker changed
	for _, a := range answers {
		count[a.ver]++
		switch {
		case a.ver == "v2" && a.got.Before(cut):
			wrong = append(wrong, fmt.Sprintf("v2 (pid %d) answered %s before the cutover", a.pid, cut.Sub(a.got)))
		case a.ver == "v1" && !a.reused && a.sent.After(drain):
			wrong = append(wrong, fmt.Sprintf("v1 (pid %d) answered a connection opened %s after the first drain began", a.pid, a.sent.Sub(drain)))
		case a.ver == "v1" && !a.reused && a.sent.After(cut):
			lateV1, lateV1Max = lateV1+1, max(lateV1Max, a.sent.Sub(cut))
		case a.ver != "v1" && a.ver != "v2":
			wrong = append(wrong, fmt.Sprintf("pid %d answered as %q", a.pid, a.ver))
		}
		if a.src == "" {
			continue
		}
		if r := runs[a.src]; len(r) == 0 || r[len(r)-1].pid != a.pid && (sticky || r[len(r)-1].ver != a.ver) {
			runs[a.src] = append(r, a)
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d answers on the wrong side of the cutover, e.g.:\n%s", len(wrong), len(answers), strings.Join(wrong[:min(5, len(wrong))], "\n"))
	}
	if count["v1"] == 0 || count["v2"] == 0 {
		t.Errorf("answers by version %v: the load did not span the cutover", count)
	}
	var latest time.Duration // the latest a client's first v2 answer was sent after the cutover
	for _, src := range cutoverSources {
		r := runs[src]
		if len(r) != 2 || r[0].ver != "v1" || r[1].ver != "v2" {
			var seq []string
			for _, a := range r {
				seq = append(seq, fmt.Sprintf("%s/%d", a.ver, a.pid))
			}
			t.Errorf("client %s was answered by %v in turn; want v1, then v2%s", src, seq,
				map[bool]string{true: " (one worker each)"}[sticky])
			continue
		}
		latest = max(latest, r[1].sent.Sub(cut))
	}
	t.Logf("%v answers; cutover %s after the last v2 worker was ready, first drain %s after the cutover; every client's first v2 answer was sent at most %s after the cutover; %d v1 answers to connections opened after the cutover's stamp (at most %s after)",
		count, cut.Sub(lastReady).Round(time.Microsecond), drain.Sub(cut).Round(time.Microsecond), latest.Round(time.Microsecond),
		lateV1, lateV1Max.Round(time.Microsecond))
}

// TestBlueGreenNeverReadyKeepsV1Alone: on a steered pool, a blue-green
// reload whose v2 worker of slot 1 serves but never gets ready is
// abandoned: nothing failed, no cutover, no answer from v2 (its ready
// workers waited as spares), and v1's workers still serve.
func TestBlueGreenNeverReadyKeepsV1Alone(t *testing.T) {
	needSteering(t)
	port := FreePort(t)
	const instances = 3
	extra := `balance = "even"` + "\n" + `ready_timeout = "2s"`
	a := StartAgent(t, bins, versionedApp(port, instances, "v1", "", extra))
	st := a.WaitFor("ready", 20*time.Second, func(st *api.Status) bool { return AllReady(st, "web", instances) })
	before := PIDs(appOf(st, "web"))
	loads := startCutoverLoads(t, port)
	a.WriteConfig(versionedApp(port, instances, "v2", `TESTAPP_NEVER_READY_SLOT = "1"`, extra))
	r := a.CLI("reload", "web", "--strategy", "blue-green", "--json")
	answers := loads.stopAfter(t, time.Now())
	if r.Code != 1 {
		t.Fatalf("reload: exit %d, want 1 (abandoned)\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, e := range reloadEvents(r.Stdout) {
		if e.Type == api.EventCutover {
			t.Errorf("an abandoned reload switched: %+v", e)
		}
	}
	count := map[string]int{}
	for _, a := range answers {
		count[a.ver]++
	}
	if count["v2"] != 0 || count["v1"] == 0 {
		t.Errorf("answers by version %v; want v1 only", count)
	}
	if after := PIDs(a.App("web")); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("v1's workers must be untouched: before %v, after %v", before, after)
	}
	t.Logf("answers by version %v", count)
}
