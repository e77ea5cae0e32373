package jsdrain

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The apps of these tests: /slow is in flight until the app's own timer
// ends (it prints "slow" when it begins), / answers at once.
const (
	bunApp = `Bun.serve({ port: Number(process.env.PORT), async fetch(req) {
  if (new URL(req.url).pathname === "/slow") { console.log("slow"); await Bun.sleep(1500); }
  return new Response("done\n");
} });
console.log("listening");`
	denoApp = `Deno.serve({ port: Number(Deno.env.get("PORT")), onListen() { console.log("listening"); } }, async (req) => {
  if (new URL(req.url).pathname === "/slow") { console.log("slow"); await new Promise((r) => setTimeout(r, 1500)); }
  return new Response("done\n");
});`
)

// runtimeBin is the bun or deno that integration/selfbindapps installed
// (npm ci --prefix integration/selfbindapps), or skips.
func runtimeBin(t *testing.T, rt Runtime) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "integration", "selfbindapps", "node_modules", ".bin", string(rt)))
	if err == nil {
		_, err = os.Stat(p)
	}
	if err != nil {
		t.Skipf("%s not installed (npm ci --prefix integration/selfbindapps): %v", rt, err)
	}
	return p
}

// A request in flight when the stop signal comes gets its whole answer,
// with "Connection: close"; a kept-alive connection's next request is
// answered too, with "Connection: close", then closed; the process exits 0
// once both are answered.
func TestInFlightRequestFinishesWithConnectionClose(t *testing.T) {
	for _, rt := range []Runtime{Bun, Deno} {
		t.Run(string(rt), func(t *testing.T) {
			checkInFlight(t, rt, true)
		})
	}
}

func startApp(t *testing.T, rt Runtime, drain bool) (cmd *exec.Cmd, port int, out *bufio.Reader) {
	t.Helper()
	src := bunApp
	if rt == Deno {
		src = denoApp
	}
	return startAppWith(t, rt, src, drain)
}

// startAppSource starts src with the drain.
func startAppSource(t *testing.T, rt Runtime, src string) (*exec.Cmd, int, *bufio.Reader) {
	t.Helper()
	return startAppWith(t, rt, src, true)
}

func startAppWith(t *testing.T, rt Runtime, src string, drain bool) (cmd *exec.Cmd, port int, out *bufio.Reader) {
	t.Helper()
	bin, dir := runtimeBin(t, rt), t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	app := filepath.Join(dir, "app.js")
	argv := []string{bin, "run", app} // bun run: the form BUN_OPTIONS must not break
	if rt == Deno {
		argv = []string{bin, "run", "--allow-net", "--allow-env", app}
	}
	if err := os.WriteFile(app, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), fmt.Sprintf("PORT=%d", port), "DENO_DIR="+filepath.Join(dir, "deno"), "NO_COLOR=1")
	if drain {
		s, err := Install(dir, rt, "SIGTERM", 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		argv, env = s.Apply(argv, env)
	}
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stderr = env, os.Stderr
	pr, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out = bufio.NewReader(pr)
	waitLine(t, out, "listening")
	return cmd, port, out
}

// waitLine reads the app's stdout until a line is want, within 30 s.
func waitLine(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				got <- fmt.Errorf("stdout ended before %q: %w", want, err)
				return
			}
			if strings.TrimSpace(line) == want {
				got <- nil
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no %q from the app within 30 s", want)
	}
}

func dial(t *testing.T, port int) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}

func get(c net.Conn, r *bufio.Reader, path string) (*http.Response, string, error) {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return nil, "", err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

func checkInFlight(t *testing.T, rt Runtime, drain bool) {
	cmd, port, out := startApp(t, rt, drain)
	kc, kr := dial(t, port)
	if _, _, err := get(kc, kr, "/"); err != nil {
		t.Fatal(err)
	}
	sc, sr := dial(t, port)
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	slow := make(chan answer, 1)
	go func() {
		resp, body, err := get(sc, sr, "/slow")
		slow <- answer{resp, body, err}
	}()
	waitLine(t, out, "slow")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The kept-alive connection: asked until an answer says close (the
	// signal is handled by then), and never cut.
	for {
		resp, body, err := get(kc, kr, "/")
		if err != nil {
			t.Fatalf("a kept-alive connection's request after the stop signal: %v", err)
		}
		if body != "done\n" {
			t.Fatalf("kept-alive answer %q", body)
		}
		if resp.Close {
			break
		}
	}
	if n, err := kr.ReadByte(); err == nil {
		t.Errorf("kept-alive connection still open after Connection: close (read %q)", n)
	}
	a := <-slow
	if a.err != nil {
		t.Fatalf("the request in flight at the stop signal: %v", a.err)
	}
	if a.body != "done\n" || !a.resp.Close {
		t.Fatalf("the request in flight: body %q, Connection: close %v; want done and close", a.body, a.resp.Close)
	}
	werr := make(chan error, 1)
	go func() { werr <- cmd.Wait() }()
	select {
	case err := <-werr:
		var ee *exec.ExitError
		if errors.As(err, &ee) || err != nil {
			t.Errorf("%s exited with %v after its drain, want 0", rt, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s still runs 15 s after its drain", rt)
	}
}

// A Bun app with its own handler for the stop signal exits when it
// decides: the drain does not cut its cleanup short (here it exits 7 once
// its cleanup is done, after the drain had nothing left).
func TestBunAppsOwnStopHandlerDecidesTheExit(t *testing.T) {
	cmd, port, out := startAppSource(t, Bun, bunApp+`
process.on("SIGTERM", () => { setTimeout(() => { console.log("cleaned up"); process.exit(7); }, 2500); });`)
	c, r := dial(t, port)
	if _, _, err := get(c, r, "/"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLine(t, out, "cleaned up")
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("bun exited with %v, want the app's own exit 7 after its cleanup", err)
	}
}
