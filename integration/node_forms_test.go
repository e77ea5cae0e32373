package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/integration/loadgen"
)

// Node.js apps that bind the inherited socket themselves, in every form a
// server takes it (issue 33), and the tutorials' apps that used to lose
// requests on reload: a CPU-bound route, the cluster module. Each is
// reloaded 5 times under a keep-alive and a new-connection load at once
// and must fail no request.

// fdApp is an Express app written to the socket-activation contract.
const fdApp = `const express = require('express')
const app = express()

app.get('/', (req, res) => {
  res.send('Hello World!')
})

const server = app.listen({ fd: 3 }, () => {
  console.log('Example app listening on port 3000')
  if (process.send) process.send('ready')
})
`

// fdCloseApp is fdApp with the usual shutdown handler.
const fdCloseApp = fdApp + `
process.on('SIGTERM', () => {
  console.log('SIGTERM received, closing server')
  server.close(() => process.exit(0))
})
`

// handleApp listens on a handle it made of the inherited fd.
const handleApp = `const express = require('express')
const { TCP, constants } = process.binding('tcp_wrap')
const app = express()

app.get('/', (req, res) => {
  res.send('Hello World!')
})

const handle = new TCP(constants.SERVER)
handle.open(3)
app.listen(handle, () => {
  console.log('Example app listening on port 3000')
})
`

// httpsApp serves Express over https on the inherited fd.
const httpsApp = `const express = require('express')
const https = require('https')
const fs = require('fs')
const app = express()

app.get('/', (req, res) => {
  res.send('Hello World!')
})

https.createServer({ key: fs.readFileSync('key.pem'), cert: fs.readFileSync('cert.pem') }, app).listen({ fd: 3 }, () => {
  console.log('Example app listening on port 3000')
})
`

// http2App is node's HTTP/2 example (the stream API) over TLS on the inherited fd.
const http2App = `const http2 = require('http2')
const fs = require('fs')

const server = http2.createSecureServer({ key: fs.readFileSync('key.pem'), cert: fs.readFileSync('cert.pem') })
server.on('error', (err) => console.error(err))
server.on('stream', (stream, headers) => {
  stream.respond({ 'content-type': 'text/plain; charset=utf-8', ':status': 200 })
  stream.end('Hello World!')
})

server.listen({ fd: 3 }, () => {
  console.log('Example app listening on port 3000')
})
`

// writeCert writes a self-signed key and certificate for 127.0.0.1 into
// dir (key.pem, cert.pem) and returns a client config that trusts it.
func writeCert(t *testing.T, dir string) *tls.Config {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{RootCAs: pool}
}

// formLoad starts ka keep-alive and nka new-connection clients of o (whose
// Clients and KeepAlive it sets), each checking for "Hello World!", bounded
// by 2 000 000 requests and 4 minutes.
func formLoad(t *testing.T, o loadgen.Options, ka, nka int) func() (loadgen.Result, loadgen.Result) {
	t.Helper()
	o.Check = func(status int, body []byte) error {
		if status != 200 || string(body) != "Hello World!" {
			return fmt.Errorf("status %d body %q", status, body)
		}
		return nil
	}
	o.MaxRequests, o.MaxDuration = 2_000_000, 4*time.Minute
	holdLoadSlot(t)
	var ls []*loadgen.Load
	for _, c := range []struct {
		n  int
		ka bool
	}{{ka, true}, {nka, false}} {
		o.Clients, o.KeepAlive = c.n, c.ka
		l, err := loadgen.Start(context.Background(), o)
		if err != nil {
			for _, l := range ls {
				l.Stop()
			}
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	t.Cleanup(func() { ls[0].Stop(); ls[1].Stop() })
	return func() (loadgen.Result, loadgen.Result) { return ls[0].Stop(), ls[1].Stop() }
}

// reloadForm runs js (port 3000 replaced by a free one; certDir, when
// given, writes its certificate) as 2 workers and reloads it 5 times under
// 20 keep-alive and 20 new-connection clients of o. It returns the port
// and the options the load used.
func reloadForm(t *testing.T, js, extra string, o loadgen.Options, certDir func(dir string) *tls.Config) (int, loadgen.Options) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": js})
	o.URL = fmt.Sprintf("http://127.0.0.1:%d/", port)
	if certDir != nil {
		o.TLS = certDir(dir)
		o.URL = fmt.Sprintf("https://127.0.0.1:%d/", port)
	}
	reloadNodeUnder(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, extra), port, 2, 5,
		func() func() (loadgen.Result, loadgen.Result) { return formLoad(t, o, 20, 20) })
	return port, o
}

func TestNodeFdListen(t *testing.T) {
	reloadForm(t, fdApp, `ready = "node-ipc"`, loadgen.Options{}, nil)
}

func TestNodeFdListenServerClose(t *testing.T) {
	reloadForm(t, fdCloseApp, `ready = "node-ipc"`, loadgen.Options{}, nil)
}

func TestNodeHandleListen(t *testing.T) {
	reloadForm(t, handleApp, "", loadgen.Options{}, nil)
}

func TestNodeHTTPSFdListen(t *testing.T) {
	reloadForm(t, httpsApp, "", loadgen.Options{}, func(dir string) *tls.Config { return writeCert(t, dir) })
}

// Each keep-alive client keeps one HTTP/2 session open across the reloads'
// GOAWAYs; each new-connection client opens a session per request.
func TestNodeHTTP2FdListen(t *testing.T) {
	port, o := reloadForm(t, http2App, "", loadgen.Options{HTTP2: true}, func(dir string) *tls.Config { return writeCert(t, dir) })
	tr := &http.Transport{TLSClientConfig: o.TLS, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(fmt.Sprintf("https://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("the load spoke %s, want HTTP/2", resp.Proto)
	}
}

// cpuApp is the tutorials' CPU-bound route (~100 ms of CPU per request).
const cpuApp = `const express = require('express')
const app = express()
const port = 3000

app.get('/', (req, res) => {
  res.send('Hello World!')
})

app.get('/load', (req, res) => {
  let total = 0
  const end = Date.now() + 100
  do total++; while (Date.now() < end) // once at least, however late it runs
  res.send(total > 0 ? 'Hello World!' : 'Hello World')
})

app.listen(port, () => {
  console.log(` + "`Example app listening on port ${port}`" + `)
})
`

// 64 keep-alive clients and 8 new-connection ones on a 100 ms CPU-bound
// route of 2 workers: every request waits seconds in its socket, unread,
// while the event loop runs the others. The per-request timeout is 60 s,
// far above the queue, so that a slow shared machine fails no request.
func TestNodeCPUBoundRoute(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": cpuApp})
	cfg := strings.Replace(nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), `stop_timeout = "15s"`, `stop_timeout = "60s"`, 1)
	cfg = strings.Replace(cfg, `ready_timeout = "20s"`, `ready_timeout = "60s"`, 1)
	o := loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/load", port), Timeout: 60 * time.Second}
	reloadNodeUnder(t, cfg, port, 2, 5, func() func() (loadgen.Result, loadgen.Result) { return formLoad(t, o, 64, 8) })
}

// clusterApp is the clustering tutorials' Express app as they write it.
const clusterApp = `const cluster = require('cluster')
const os = require('os')
const express = require('express')
const port = 3000
const totalCPUs = os.cpus().length

if (cluster.isMaster) {
  console.log(` + "`Number of CPUs is ${totalCPUs}`" + `)
  console.log(` + "`Master ${process.pid} is running`" + `)

  for (let i = 0; i < totalCPUs; i++) {
    cluster.fork()
  }

  cluster.on('exit', (worker, code, signal) => {
    console.log(` + "`worker ${worker.process.pid} died`" + `)
    console.log("Let's fork another worker!")
    cluster.fork()
  })
} else {
  const app = express()
  console.log(` + "`Worker ${process.pid} started`" + `)

  app.get('/', (req, res) => {
    res.send('Hello World!')
  })

  app.listen(port, () => {
    console.log(` + "`Example app listening on port ${port}`" + `)
  })
}
`

// The cluster app with instances = 2 runs exactly 2 processes, none with
// children (the app takes its worker branch), and reloads dropping nothing.
func TestNodeClusterApp(t *testing.T) {
	parallelUnderLoad(t) // see parallel.go
	port := FreePort(t)
	dir := nodeApp(t, "express5", port, map[string]string{"app.js": clusterApp})
	var a *Agent
	a = reloadNodeUnder(t, nodeConfig(dir, []string{"node", "app.js"}, port, 2, ""), port, 2, 5,
		func() func() (loadgen.Result, loadgen.Result) {
			return formLoad(t, loadgen.Options{URL: fmt.Sprintf("http://127.0.0.1:%d/", port)}, 20, 20)
		})
	pids := PIDs(a.App("web"))
	if len(pids) != 2 {
		t.Errorf("workers %v, want 2", pids)
	}
	for slot, pid := range pids {
		if kids := childrenOf(pid); len(kids) != 0 {
			t.Errorf("worker %d (pid %d) has children %v, want none", slot, pid, kids)
		}
	}
	b, _ := os.ReadFile(filepath.Join(a.Dir, "logs", "web.out.log"))
	if strings.Contains(string(b), "is running") {
		t.Errorf("the app ran its primary branch:\n%s", b)
	}
}

// childrenOf lists the pids whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		var state string
		var ppid, self int
		if _, err := fmt.Sscanf(s[i+2:], "%s %d", &state, &ppid); err == nil && ppid == pid {
			fmt.Sscanf(e.Name(), "%d", &self)
			kids = append(kids, self)
		}
	}
	return kids
}
