package integration

import (
	"os"
	"testing"
)

// Bun.serve and Deno.serve apps as their docs write them (no signal code,
// their bind answered with the agent's socket), 2 workers: over 5 reloads
// under a keep-alive and a new-connection load at once no request fails.
// Without deployd's drain preload (workers/jsdrain) both exit on SIGTERM
// with requests in flight, and close kept-alive connections under their
// clients (DEPLOYD_TEST_JSDRAIN=off runs the test with node = "off",
// which turns the drain off).
func TestBunAndDenoDrainedOnReload(t *testing.T) {
	for _, sb := range selfBinders {
		if sb.name != "bun" && sb.name != "deno" {
			continue
		}
		t.Run(sb.name, func(t *testing.T) {
			parallelUnderLoad(t)
			checkJSDrain(t, sb)
		})
	}
}

func checkJSDrain(t *testing.T, sb selfBinder) {
	const instances, reloads = 2, 5
	// Deno's shutdown closes connections it accepted and has not read: the
	// default balance gives each worker that binds a socket of its own, and
	// the agent's quiet stop runs them dry first.
	more := ""
	if os.Getenv("DEPLOYD_TEST_JSDRAIN") == "off" { // the figures without the drain
		more += `node = "off"`
	}
	a, port, app, _ := startSelfBinder(t, sb, instances, more)
	ka, nka := reloadsUnderLoad(t, a, port, app, 2, reloads)
	requireNoFailures(t, sb.name+" reloads, keep-alive", ka)
	requireNoFailures(t, sb.name+" reloads, new-connection", nka)
}
