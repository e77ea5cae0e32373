package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// clusterTS is the first clustering tutorial's app (`yarn ts-node
// src/cluster.ts`): its primary forks a worker per CPU with Node's cluster
// module and forks again when one dies; each worker serves Express.
const clusterTS = `import cluster from 'cluster'
import os from 'os'
import express from 'express'

const port = Number(process.env.PORT) || 3000

if (cluster.isPrimary) {
  const cpus = os.cpus().length
  console.log(` + "`primary ${process.pid} forking ${cpus} workers`" + `)
  for (let i = 0; i < cpus; i++) {
    cluster.fork()
  }
  cluster.on('exit', (worker) => {
    console.log(` + "`worker ${worker.process.pid} died; forking another`" + `)
    cluster.fork()
  })
} else {
  const app = express()
  app.get('/', (_req, res) => {
    res.send('Hello World!')
  })
  app.listen(port, () => {
    console.log(` + "`worker ${process.pid} listening on port ${port}`" + `)
  })
}
`

// The seed's ts-node cluster app, started as its README says PM2 users
// start it: the project's ts-node runs it (type-checked, as ts-node does by
// default), the cluster module's primary branch gives way to deployd's own
// workers, and reloads lose nothing under keep-alive and new connections.
func TestStartTsNodeClusterApp(t *testing.T) {
	parallelUnderLoad(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{
		"package.json":  `{"name": "cluster-ts", "scripts": {"start": "ts-node src/cluster.ts"}}`,
		"tsconfig.json": `{"compilerOptions": {"target": "es2020", "module": "commonjs", "esModuleInterop": true, "skipLibCheck": true}}`,
	})
	body := strings.ReplaceAll(clusterTS, "3000", strconv.Itoa(port))
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "src", "cluster.ts"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	// The project has ts-node, typescript 5 and @types/node installed, and no
	// tsx (npm install --save-dev ts-node typescript@5 @types/node).
	fx := filepath.Join(nodeFixtures(t), "node_modules")
	for _, m := range []string{"ts-node", "typescript", "@types/node"} {
		link := filepath.Join(dir, "node_modules", m)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(fx, m), link); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "node_modules", ".bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../ts-node/dist/bin.js", filepath.Join(bin, "ts-node")); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()

	r := a.CLIIn(dir, "start", "src/cluster.ts", "-i", "2")
	if r.Code != 0 {
		errLog, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "cluster.err.log"))
		t.Fatalf("deployd start src/cluster.ts -i 2: exit %d\n%s\napp's stderr:\n%s\nagent log:\n%s", r.Code, r.Stderr, errLog, a.Log())
	}
	cfg, _ := os.ReadFile(a.Config)
	if want := `command   = ["` + filepath.Join(bin, "ts-node") + `", "src/cluster.ts"]`; !strings.Contains(string(cfg), want) {
		t.Errorf("config lacks %s:\n%s", want, cfg)
	}
	// ts-node type-checks before the app's first line: on a busy host that
	// takes longer than the default 30 s in which a new app must listen.
	if want := `ready_timeout = "2m"`; !strings.Contains(string(cfg), want) {
		t.Errorf("config lacks %s:\n%s", want, cfg)
	}
	st := a.WaitFor("2 ready workers", 90*time.Second, func(st *api.Status) bool { return AllReady(st, "cluster", 2) })
	before := PIDs(appOf(st, "cluster"))
	stop := helloLoad(t, port, 10, 4*time.Minute)
	for i := 1; i <= 2; i++ {
		if r := a.CLIIn(dir, "reload", "cluster"); r.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s\n%s", i, r.Code, r.Stderr, a.Log())
		}
	}
	ka, nka := stop()
	requireNoFailures(t, "keep-alive clients", ka)
	requireNoFailures(t, "new-connection clients", nka)
	after := PIDs(appOf(a.Status(), "cluster"))
	for slot, pid := range after {
		if before[slot] == pid {
			t.Errorf("worker %d (pid %d) was not replaced by the reloads", slot, pid)
		}
	}
	// Each worker took the worker branch: no primary forked (a fork in a
	// deployd worker throws), and every process served.
	out, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "cluster.out.log"))
	if strings.Contains(string(out), "forking") {
		t.Errorf("a worker took the cluster primary's branch:\n%s", out)
	}
	if n := strings.Count(string(out), "listening on port"); n < 6 {
		t.Errorf("%d workers said they listen, want 6 (2 started, 2 reloads of 2):\n%s", n, out)
	}
	// The preload's own drain lines go to the agent's log, not the app's.
	errLog, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "cluster.err.log"))
	if strings.Contains(string(errLog), "draining") {
		t.Errorf("the app's stderr log holds the preload's drain lines:\n%s", errLog)
	}
	if !strings.Contains(a.Log(), `did="SIGTERM: draining`) {
		t.Errorf("the agent's log does not say the workers drained:\n%s", a.Log())
	}
}

// The same cluster app as an ES module ("type": "module") run by the
// project's tsx: its imports do not go through require, so the preload
// must know a .ts entry is an ES module to give it the worker branch;
// else each deployd worker forked a cluster of its own.
func TestStartTsxESMClusterAppTakesTheWorkerBranch(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	dir := nodeApp(t, "express4", port, map[string]string{"package.json": `{"type": "module"}`})
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := strings.ReplaceAll(clusterTS, "3000", strconv.Itoa(port))
	if err := os.WriteFile(filepath.Join(dir, "src", "cluster.ts"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(nodeFixtures(t), "node_modules", "tsx"), filepath.Join(dir, "node_modules", "tsx")); err != nil {
		t.Fatal(err)
	}
	a := NewAgentDir(t, bins, agentOnlyConfig)
	a.Start()
	if r := a.CLIIn(dir, "start", "src/cluster.ts", "-i", "2"); r.Code != 0 {
		t.Fatalf("deployd start src/cluster.ts -i 2: exit %d\n%s\n%s", r.Code, r.Stderr, a.Log())
	}
	a.WaitFor("2 ready workers", 60*time.Second, func(st *api.Status) bool { return AllReady(st, "cluster", 2) })
	out, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "cluster.out.log"))
	if strings.Contains(string(out), "forking") {
		t.Errorf("a deployd worker took the cluster primary's branch and forked:\n%s", out)
	}
	if n := strings.Count(string(out), "listening on port"); n != 2 {
		t.Errorf("%d processes said they listen, want 2 (the deployd workers):\n%s", n, out)
	}
}
