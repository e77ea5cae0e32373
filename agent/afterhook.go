package agent

import (
	"context"
	"sync"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// afterHooks tracks the after hooks that run or wait to run: a deploy's
// (run by its request) and a promoted canary's (queued by the hold's end,
// run by the promote that asked for it or, when the hold ended by itself,
// by a goroutine of its own). A shutdown and an upgrade wait for them:
// each is bounded by its after_timeout and the kill grace. Once the agent
// stops, none starts. The zero value is ready; safe for concurrent use.
type afterHooks struct {
	mu      sync.Mutex
	closed  bool
	running int
	idle    chan struct{} // closed when running drops to 0; nil while it is 0
	// queued is each app's promoted canary's after hook not yet started.
	queued map[*appRT]*hookRun
}

// enter counts one more hook (or queue) running; false once the agent
// stops.
func (t *afterHooks) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.running == 0 {
		t.idle = make(chan struct{})
	}
	t.running++
	return true
}

func (t *afterHooks) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running--; t.running == 0 {
		close(t.idle)
		t.idle = nil
	}
}

// wait returns once no hook runs (hooks started meanwhile included), or
// with ctx's error.
func (t *afterHooks) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		idle := t.idle
		t.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// close lets no hook start any more and waits for those running. Safe to
// call twice.
func (t *afterHooks) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	_ = t.wait(context.Background())
}

// queue queues h as rt's after hook to run.
func (t *afterHooks) queue(rt *appRT, h *hookRun) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queued == nil {
		t.queued = map[*appRT]*hookRun{}
	}
	t.queued[rt] = h
}

// count is how many hooks (or queues) run.
func (t *afterHooks) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.running
}

// take returns and forgets rt's queued hook, nil when none is.
func (t *afterHooks) take(rt *appRT) *hookRun {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.queued[rt]
	delete(t.queued, rt)
	return h
}

// queueAfter queues h, the after hook of rt's canary that was just
// promoted (called by the hold's end, before the app admits its next
// operation), and starts a goroutine that runs it under a claim on rt
// (admit.go) unless the promote that holds the claim runs it first
// (runQueued). A hold that ended by itself claims the app at once, so no
// operation slips in before its hook, as none does before a deploy's after
// hook.
func (k *hooks) queueAfter(rt *appRT, h *hookRun) {
	if !k.after.enter() {
		rt.log.Error("after hook not run: the agent is stopping", "hook", h.name, "version", h.version)
		return
	}
	k.after.queue(rt, h)
	const what = "after hook of a promoted canary"
	release, err := rt.sup.Claim(what)
	go func() {
		defer k.after.leave()
		if err != nil {
			release = rt.sup.ClaimWait(what)
		}
		defer release()
		k.runQueued(rt, discard)
	}()
}

// runQueued runs rt's queued after hook, if any, announcing it to emit;
// the caller holds a claim on rt. Nil when none was queued.
func (k *hooks) runQueued(rt *appRT, emit func(workers.Event)) []api.HookResult {
	h := k.after.take(rt)
	if h == nil {
		return nil
	}
	return []api.HookResult{k.run(rt, rt.config(), h, emit)}
}

// wait waits, for an upgrade, until no after hook runs: the agent that
// started a hook reports its end.
func (k *hooks) wait(ctx context.Context) error {
	if n := k.after.count(); n > 0 {
		k.log.Info("upgrade: waiting for after hooks to end", "hooks", n)
	}
	return k.after.wait(ctx)
}

// close lets no after hook start any more and waits for those running.
func (k *hooks) close() { k.after.close() }
