package integration

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Most tests here spend their time waiting on processes and timers
// (agents and workers starting, readiness, drains, a crash loop's
// backoff, a canary's timeout, Node.js, Python and ansible-playbook
// start-ups), not on the CPU. They call parallel(t), and up to
// testParallel of them run at a time (-parallel N sets that number). Each
// test has its own agent, folder and ports (FreePort, outside the range
// outgoing connections take theirs from), and none uses t.Setenv or
// os.Chdir: the agent's environment is Agent.Env.
//
// A test whose load generator runs flat out (startLoad and the like: as
// many requests as the CPU allows) calls parallelUnderLoad instead: at most
// loadSlots such tests run at once, so that their loads and the drains they
// watch are not starved. A test waiting for a load slot holds no run slot,
// so the other tests go on meanwhile; that is why the slots are counted
// here and not by go test's -parallel, which TestMain sets past the number
// of tests.
//
// Tests that measure time on the agent's side with a tight bound (a
// refusal "at once", a page's lag), the agent's own descriptors, memory or
// threads, or a throughput stay serial; go test runs them first, each
// alone.
const testParallel = 6

// runSlots and loadSlots: see above. A test holds its slots until it ends.
var (
	runSlots  chan struct{} // made by TestMain (setParallel)
	loadSlots = make(chan struct{}, 2)
	// slotsHeld are the top-level tests holding a run slot ("run") or
	// a load slot ("load").
	slotsHeld sync.Map
)

// parallel is t.Parallel() for the tests of this package: it then waits
// for a run slot.
func parallel(t *testing.T) {
	t.Parallel()
	takeSlot(t, "run", runSlots)
}

// parallelUnderLoad is t.Parallel() for a test that puts load on the
// machine: it waits for a load slot, then a run slot.
func parallelUnderLoad(t *testing.T) {
	t.Parallel()
	takeSlot(t, "load", loadSlots)
	takeSlot(t, "run", runSlots)
}

// parallelFirst is t.Parallel() for the longest test, which waits minutes
// on processes (ansible-playbook): it runs from the start, beside the
// run slots' tests, instead of waiting for a slot and finishing last.
func parallelFirst(t *testing.T) {
	t.Parallel()
	key := topName(t) + " run"
	slotsHeld.Store(key, true)
	t.Cleanup(func() { slotsHeld.Delete(key) })
}

// takeSlot waits for a slot of slots and holds it, as kind, until t ends.
func takeSlot(t testing.TB, kind string, slots chan struct{}) {
	key := topName(t) + " " + kind
	if _, held := slotsHeld.LoadOrStore(key, true); held {
		return
	}
	slots <- struct{}{}
	t.Cleanup(func() {
		slotsHeld.Delete(key)
		<-slots
	})
}

// holdLoadSlot is called by the load helpers. A test that runs alone
// takes the load slot (they are all free then); a parallel test must have
// taken one with parallelUnderLoad: waiting for it while holding a run
// slot could wait for ever.
func holdLoadSlot(t testing.TB) {
	t.Helper()
	top := topName(t)
	if _, ok := slotsHeld.Load(top + " load"); ok {
		return
	}
	if _, ok := slotsHeld.Load(top + " run"); ok {
		t.Fatalf("%s puts load on the machine: it must call parallelUnderLoad(t), not parallel(t) (integration/parallel.go)", top)
	}
	takeSlot(t, "load", loadSlots)
}

// checkSlot fails a test that runs beside parallel ones without a run
// slot: one that called t.Parallel() itself instead of parallel(t).
// (Serial tests run before every parallel one.)
func checkSlot(t testing.TB) {
	t.Helper()
	top := topName(t)
	if _, ok := slotsHeld.Load(top + " run"); ok {
		return
	}
	others := false
	slotsHeld.Range(func(k, _ any) bool { others = strings.HasSuffix(k.(string), " run"); return !others })
	if others {
		t.Fatalf("%s runs in parallel without a run slot: call parallel(t) or parallelUnderLoad(t), not t.Parallel() (integration/parallel.go)", top)
	}
}

// topName is the name of t's top-level test.
func topName(t testing.TB) string {
	top, _, _ := strings.Cut(t.Name(), "/")
	return top
}

// setParallel makes go test start every parallel test at once (they then
// wait for a slot here) and sizes runSlots: testParallel, or -parallel N.
// TestMain calls it after flag.Parse.
func setParallel() error {
	n := testParallel
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			n, _ = strconv.Atoi(f.Value.String())
		}
	})
	if n < 1 {
		return fmt.Errorf("-parallel %d: want at least 1", n)
	}
	runSlots = make(chan struct{}, n)
	return flag.Set("test.parallel", "1000")
}
