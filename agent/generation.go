package agent

import "sync"

// generations numbers each app's specs on its own: its first is 1, and
// every spec built for it after (a start, reload, deploy, discovery run)
// one more, so that GEN in `deployd status` counts that app's rollouts and
// not every app's. Safe for concurrent use.
type generations struct {
	mu   sync.Mutex
	last map[string]int // owned by mu
}

// next returns app's next generation. The first call for an app goes on
// from seen(): the newest generation of the workers an earlier agent
// handed over or left, so that a replacement is always newer than the
// worker it replaces (survivors are sorted by it).
func (g *generations) next(app string, seen func() int) int {
	base := 0
	if !g.known(app) {
		base = seen()
	}
	return g.add(app, base)
}

// known says whether app has had a generation from g.
func (g *generations) known(app string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.last[app]
	return ok
}

// add moves app's count past both its last one and base, and returns it.
func (g *generations) add(app string, base int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		g.last = make(map[string]int)
	}
	n := max(g.last[app], base) + 1
	g.last[app] = n
	return n
}
