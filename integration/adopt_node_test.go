package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// ipcApp is the tutorial app with ready = "node-ipc" (process.send('ready')
// half a second after listen) and a route that sends on the IPC channel
// and says whether node still sees it connected.
const ipcApp = `const express = require('express')
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

app.get('/ipc', (req, res) => {
  process.send('ping', (err) => {
    res.send('connected=' + process.connected + ' err=' + (err ? err.code : 'none') + ' pid=' + process.pid)
  })
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
  setTimeout(() => process.send('ready'), 500)
})
`

// TestNodeWorkersAdoptedAcrossUpgrades: both channels of a Node.js worker
// cross an agent upgrade. Its node-ipc channel (NODE_CHANNEL_FD) stays
// connected once the old agent is gone, and the preload's channel (fd 50)
// still reports to the new agent: when a reload stops the adopted workers,
// their "STATUS=draining" reaches the new agent (its exit event carries
// it). The reload's new workers get ready through process.send('ready');
// no request fails.
func TestNodeWorkersAdoptedAcrossUpgrades(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"app.js": ipcApp})
	a := NewAgentDir(t, bins, nodeConfig(dir, []string{"node", "app.js"}, port, 2, `ready = "node-ipc"`))
	a.UseOwnBinary()
	a.Start()
	st := a.WaitFor("ready", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
	before := slotPIDs(st, "web")
	stop := helloLoad(t, port, 20, 3*time.Minute)
	for _, kind := range []string{"cli", "sighup"} {
		upgradeBy(t, a, kind)
		st = a.WaitFor("ready after the upgrade", 10*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 2) })
		if got := slotPIDs(st, "web"); got[0] != before[0] || got[1] != before[1] {
			t.Fatalf("after the %s upgrade slots run %v, want the adopted %v", kind, got, before)
		}
	}
	// The old agents are gone: node still sees its channel connected.
	seen := map[int]string{}
	for i := 0; i < 200 && len(seen) < 2; i++ {
		body, err := get(t, port, "/ipc")
		if err != nil {
			t.Fatalf("GET /ipc: %v %s", err, body)
		}
		var pid int
		var conn, errCode string
		if _, err := fmt.Sscanf(body, "connected=%s err=%s pid=%d", &conn, &errCode, &pid); err != nil {
			t.Fatalf("GET /ipc: %q: %v", body, err)
		}
		seen[pid] = body
		if conn != "true" || errCode != "none" {
			t.Errorf("adopted worker %d after two upgrades: %q, want its IPC channel connected", pid, body)
		}
	}
	for _, pid := range before {
		if seen[pid] == "" {
			t.Errorf("adopted worker %d never answered /ipc (answers %v)", pid, seen)
		}
	}

	// A reload stops the adopted workers: their preload reports the drain
	// (STOPPING=1, STATUS=draining), and each one's exit event carries the
	// last status the new agent heard from it.
	if r := a.CLI("reload", "web"); r.Code != 0 {
		t.Fatalf("reload of the adopted app: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	st = a.Status()
	waitAllGone(t, map[int]bool{before[0]: true, before[1]: true}, 20*time.Second)
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	if !AllReady(st, "web", 2) {
		t.Fatalf("after the reload: %+v", appOf(st, "web"))
	}
	for _, w := range appOf(st, "web").Workers {
		if w.PID == before[w.Slot] {
			t.Errorf("slot %d: adopted worker %d not replaced by the reload", w.Slot, w.PID)
		}
		if w.ReadyMillis < 500 {
			t.Errorf("new worker %d ready after %d ms, before its process.send('ready') at 500 ms", w.PID, w.ReadyMillis)
		}
	}
	for _, pid := range before {
		waitLogLine(t, a, fmt.Sprintf("the exit of adopted worker %d with its preload's STATUS=draining", pid),
			"event=exited", fmt.Sprintf("pid=%d ", pid), "last status", "draining")
	}
	t.Logf("node workers %v adopted over 2 upgrades: IPC connected (%s), drain reported by the preload; reload: keep-alive %s; new-connection %s",
		before, strings.Join(func() []string {
			var out []string
			for _, b := range seen {
				out = append(out, b)
			}
			return out
		}(), "; "), ka, nka)
}
