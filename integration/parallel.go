package integration

import (
	"strings"
	"sync"
	"testing"
)

// Most tests here spend their time waiting on processes and timers
// (agents and workers starting, readiness, drains, a crash loop's
// backoff, a canary's timeout, Node.js, Python and ansible-playbook
// start-ups), not on the CPU. They call t.Parallel(), and TestMain runs up
// to testParallel of them at a time (go test's default is GOMAXPROCS, 2 on
// CI's machine; an explicit -parallel wins). Each test has its own agent,
// folder and ports (FreePort, outside the range outgoing connections take
// theirs from), and none uses t.Setenv or os.Chdir: the agent's environment
// is Agent.Env.
//
// A test whose load generator runs flat out (startLoad and the like: as
// many requests as the CPU allows) calls parallelUnderLoad instead: at most
// loadSlots such tests run at once, so that their loads and the drains they
// watch are not starved. Tests that measure time on the agent's side with a
// tight bound (a refusal "at once"), the agent's own descriptors, memory or
// threads under a flood, or a throughput stay serial; go test runs them
// first, each alone.
const testParallel = 6

// loadSlots: see above. A test holds its slot until it ends.
var loadSlots = make(chan struct{}, 2)

// loadHolders are the top-level tests holding a slot.
var loadHolders sync.Map

// parallelUnderLoad is t.Parallel() for a test that puts load on the
// machine: it then waits for a load slot.
func parallelUnderLoad(t *testing.T) {
	t.Parallel()
	holdLoadSlot(t)
}

// holdLoadSlot takes a load slot for t's top-level test unless it holds
// one. The load helpers call it too, so that a parallel test that forgot
// parallelUnderLoad still waits for a slot (then with its agent running);
// a serial test runs alone and finds them free.
func holdLoadSlot(t testing.TB) {
	top, _, _ := strings.Cut(t.Name(), "/")
	if _, held := loadHolders.LoadOrStore(top, true); held {
		return
	}
	loadSlots <- struct{}{}
	t.Cleanup(func() {
		loadHolders.Delete(top)
		<-loadSlots
	})
}
