package control

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
)

func TestLimitsFor(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   connLimits
	}{
		{20000, connLimits{PerUID: 64, Others: 256, Owners: 256}},
		{65536, connLimits{PerUID: 64, Others: 256, Owners: 256}},
		{1024, connLimits{PerUID: 8, Others: 32, Owners: 32}},
		{64, connLimits{PerUID: 4, Others: 8, Owners: 8}},
	} {
		got := limitsFor(tc.nofile)
		if got != tc.want {
			t.Errorf("limitsFor(%d) = %+v, want %+v", tc.nofile, got, tc.want)
		}
		if tc.nofile >= 1024 && uint64(got.Others+got.Owners+refusers) > tc.nofile/8 {
			t.Errorf("limitsFor(%d): clients may hold %d descriptors, more than an eighth", tc.nofile, got.Others+got.Owners+refusers)
		}
	}
}

// startLimited serves a control server behind a connLimiter that counts
// the test's own uid as a member's, with room for perUID connections.
func startLimited(t *testing.T, perUID int) (*connLimiter, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	lim := newConnLimiter(ln, connLimits{PerUID: perUID, Others: 100, Owners: 100}, func(int) bool { return false }, hclog.NewNullLogger())
	c := newControlServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "{}")
	}), nil, lim, hclog.NewNullLogger())
	served := make(chan error, 1)
	go func() { served <- c.serve(lim) }()
	t.Cleanup(func() {
		c.stop(lim)
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lim, path
}

// get sends one GET on c and returns the answer's status and body.
func rawGet(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /v1/version HTTP/1.1\r\nHost: deployd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A uid that holds its limit of connections gets 503 with a message naming
// the limit on the next one, and a place again once one closes.
func TestConnLimiterRefusesOverPerUID(t *testing.T) {
	lim, path := startLimited(t, 3)
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	if code, _ := rawGet(t, held[0]); code != http.StatusOK {
		t.Fatalf("a connection within the limit: status %d", code)
	}
	uid := os.Getuid()
	waitFor(t, "3 counted connections", func() bool { n, _, _ := lim.counts(uid); return n == 3 })
	over, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	code, body := rawGet(t, over)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the limit per uid") || !strings.Contains(body, `"kind":"limited"`) {
		t.Errorf("over the limit: %d %s", code, body)
	}
	// The Go client words it as an error of that kind.
	cl := api.NewClient(path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = cl.Version(ctx)
	var se *api.StatusError
	if !errors.As(err, &se) || se.Kind != api.KindLimited || !strings.Contains(se.Message, "too many control connections") {
		t.Errorf("client over the limit: %v", err)
	}
	held[1].Close()
	waitFor(t, "a place given back", func() bool { n, _, _ := lim.counts(uid); return n == 2 })
	if _, err := cl.Version(ctx); err != nil {
		t.Errorf("after a connection closed: %v", err)
	}
}

// An idle keep-alive connection is closed by the agent (it was kept for
// ever), and gives its place back.
func TestControlClosesIdleConnections(t *testing.T) {
	if controlIdleTimeout > 5*time.Minute || controlIdleTimeout <= 0 {
		t.Fatalf("controlIdleTimeout %s", controlIdleTimeout)
	}
	c := newControlServer(http.NotFoundHandler(), nil, nil, hclog.NewNullLogger())
	if c.srv.IdleTimeout != controlIdleTimeout {
		t.Errorf("IdleTimeout %s, want %s", c.srv.IdleTimeout, controlIdleTimeout)
	}
}
