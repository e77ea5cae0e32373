package nodejs

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// selfSigned writes a key and certificate for 127.0.0.1 into dir.
func selfSigned(t *testing.T, dir string) (key, cert string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	key, cert = filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem")
	for p, b := range map[string][]byte{
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return key, cert
}

// An HTTPS app with the common close handler (server.close, then exit):
// the preload loads https and tls only when the app has a TLS server, and
// still drains it like a plain one — a request sent on an idle keep-alive
// connection after the signal gets its answer with Connection: close
// (node's own https close would cut that idle connection), then node exits 0.
func TestPreloadDrainsAnHTTPSServer(t *testing.T) {
	key, cert := selfSigned(t, t.TempDir())
	r := startPreload(t, fmt.Sprintf(`const https = require('https'), fs = require('fs');
const port = Number(process.env.TEST_PORT);
const s = https.createServer({key: fs.readFileSync(%q), cert: fs.readFileSync(%q)}, (req, res) => res.end('ok'));
s.listen(port, () => console.log('up'));
process.on('SIGTERM', () => { s.close(() => process.exit(0)); console.log('closed'); });
`, key, cert), true)
	if !r.out.Scan() || r.out.Text() != "up" {
		t.Fatalf("app did not start: %q", r.out.Text())
	}
	r.waitCtl(t, "READY=1")
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	get := func() (*http.Response, string) {
		t.Helper()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET /: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, _ := get(); resp.Close {
		t.Fatal("Connection: close before the drain")
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if !r.out.Scan() || r.out.Text() != "closed" { // the app called server.close: the connection was idle meanwhile
		t.Fatalf("the app's handler did not run: %q", r.out.Text())
	}
	resp, body := get()
	if body != "ok" || !resp.Close {
		t.Errorf("a request on an idle TLS connection after the signal: %q, Connection: close %v", body, resp.Close)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want the app's 0", code)
	}
}

// A plain HTTP app does not pay for tls and https: the preload loads them
// only for an app that made a TLS server (they cost a worker's start
// several ms of CPU).
func TestPreloadLoadsTLSOnlyForTLSApps(t *testing.T) {
	r := startPreload(t, listenHead+`const s = http.createServer(h);
s.listen(port, () => {
  const l = process.moduleLoadList;
  console.log(Array.isArray(l) ? l.filter((m) => m === 'NativeModule tls' || m === 'NativeModule https').join(',') || 'none' : 'unknown');
});`, true)
	if !r.out.Scan() {
		t.Fatal("app did not start")
	}
	switch got := r.out.Text(); got {
	case "none":
	case "unknown":
		t.Skip("this node has no process.moduleLoadList")
	default:
		t.Errorf("a plain HTTP app has %s loaded", got)
	}
}

// An HTTP/2 server over TLS on the inherited fd: after the signal, the
// next request on an open session is served on that session, whose final
// GOAWAY comes with it (node ignores the streams that follow any GOAWAY,
// so one sent at the signal would have refused it); then node exits 0.
func TestPreloadDrainsAnHTTP2Session(t *testing.T) {
	key, cert := selfSigned(t, t.TempDir())
	r := startPreload(t, fmt.Sprintf(`const http2 = require('http2'), fs = require('fs');
const s = http2.createSecureServer({key: fs.readFileSync(%q), cert: fs.readFileSync(%q)});
s.on('stream', (stream) => { stream.respond({':status': 200}); stream.end('ok'); });
s.listen({fd: 4}, () => console.log('up'));
`, key, cert), true)
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	var conns []string
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func() string {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn.LocalAddr().String()) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", fmt.Sprintf("https://127.0.0.1:%d/", r.port), nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		defer resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("GET: %s, want HTTP/2", resp.Proto)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	get()
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	if body := get(); body != "ok" {
		t.Errorf("a request on the open session after the signal: %q", body)
	}
	if len(conns) != 2 || conns[0] != conns[1] {
		t.Errorf("connections used: %q, want the one session twice", conns)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// A TLS connection accepted before the signal whose handshake ends after
// it is served too: the drain counts connections from accept, not from
// the end of their handshake.
func TestPreloadDrainWaitsForATLSHandshake(t *testing.T) {
	key, cert := selfSigned(t, t.TempDir())
	r := startPreload(t, fmt.Sprintf(`const https = require('https'), fs = require('fs');
const s = https.createServer({key: fs.readFileSync(%q), cert: fs.readFileSync(%q)}, (req, res) => res.end('ok'));
s.on('connection', () => console.log('accepted'));
s.listen({fd: 4}, () => console.log('up'));
`, key, cert), true)
	r.line(t, "up")
	r.waitCtl(t, "READY=1")
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	r.line(t, "accepted")
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.waitCtl(t, "STOPPING=1")
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake after the signal: %v", err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "ok" || !resp.Close {
		t.Errorf("GET: %q, Connection: close %v", b, resp.Close)
	}
	if code := r.exit(t); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}
