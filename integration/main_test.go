package integration

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/integration/loadgen"
)

// bins are built once for the whole test binary.
var bins *Binaries

func TestMain(m *testing.M) {
	if argv := os.Getenv(maxRSSEnv); argv != "" {
		os.Exit(maxRSSHelper(argv))
	}
	flag.Parse()
	if err := setParallel(); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	if testing.Short() {
		fmt.Println("integration: skipped in -short mode")
		os.Exit(0)
	}
	if linkProduct() == 0 {
		fmt.Fprintln(os.Stderr, "integration: the test app's sources are not embedded")
		os.Exit(1)
	}
	var err error
	bins, err = BuildAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: build:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(bins.Dir)
	os.Exit(code)
}

// appConfig is an [apps.web] table running the test app.
func appConfig(name string, port, instances int, extra string) string {
	if !strings.Contains(extra, "ready_timeout") {
		extra = "ready_timeout = \"10s\"\n" + extra
	}
	if !strings.Contains(extra, "stop_timeout") {
		extra = "stop_timeout = \"10s\"\n" + extra
	}
	return fmt.Sprintf(`[apps.%s]
command = ["%%TESTAPP%%"]
instances = %d
listen = ["tcp://127.0.0.1:%d"]
%s
`, name, instances, port, extra)
}

// get fetches http://127.0.0.1:port/path and returns the body.
func get(t *testing.T, port int, path string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("status %s", resp.Status)
	}
	return string(b), err
}

// identities fetches / on port and returns pid -> version as the workers
// report them. want is slot -> pid (PIDs of a status): it fails the test if a
// wanted pid never answers within 2000 requests, if any other pid answers,
// or if a worker reports a slot other than its own. It keeps asking for at
// least identitiesMinPerWorker requests per worker after the last wanted pid
// answered, so a stray process still accepting on the port has its chance
// to show up.
func identities(t *testing.T, port int, want map[int]int) map[int]string {
	t.Helper()
	slotOf := map[int]int{}
	for slot, pid := range want {
		slotOf[pid] = slot
	}
	seen := map[int]string{}
	minRequests := identitiesMinPerWorker * len(want)
	for i := 0; i < 2000 && (len(seen) < len(want) || i < minRequests); i++ {
		body, err := get(t, port, "/")
		if err != nil {
			t.Fatalf("GET /: %v", err)
		}
		var ver string
		var pid, slot int
		if _, err := fmt.Sscanf(body, "version=%s pid=%d slot=%d", &ver, &pid, &slot); err != nil {
			t.Fatalf("unexpected body %q: %v", body, err)
		}
		if _, dup := seen[pid]; dup {
			continue
		}
		seen[pid] = ver
		switch wantSlot, ok := slotOf[pid]; {
		case !ok:
			t.Errorf("pid %d (slot %d, version %s) answered on port %d; the status lists only %v", pid, slot, ver, port, want)
		case wantSlot != slot:
			t.Errorf("pid %d reports slot %d, the status says slot %d", pid, slot, wantSlot)
		}
	}
	for slot, pid := range want {
		if _, ok := seen[pid]; !ok {
			t.Errorf("worker pid %d (slot %d) never answered on port %d in 2000 requests (seen %v)", pid, slot, port, seen)
		}
	}
	return seen
}

// identitiesMinPerWorker: see identities.
const identitiesMinPerWorker = 20

// startLoad starts the two loads the reload tests use: keep-alive clients
// and one-connection-per-request clients.
func startLoad(t *testing.T, port, clients int, d time.Duration) (stop func() (loadgen.Result, loadgen.Result)) {
	t.Helper()
	holdLoadSlot(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	ka, err := loadgen.Start(context.Background(), loadgen.Options{URL: url, Clients: clients, KeepAlive: true,
		MaxRequests: 5_000_000, MaxDuration: d})
	if err != nil {
		t.Fatal(err)
	}
	nka, err := loadgen.Start(context.Background(), loadgen.Options{URL: url, Clients: clients, KeepAlive: false,
		MaxRequests: 5_000_000, MaxDuration: d})
	if err != nil {
		ka.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() { ka.Stop(); nka.Stop() })
	return func() (loadgen.Result, loadgen.Result) { return ka.Stop(), nka.Stop() }
}

// requireNoFailures fails the test if a load saw any failed request.
func requireNoFailures(t *testing.T, what string, rs ...loadgen.Result) {
	t.Helper()
	for _, r := range rs {
		t.Logf("%s: %s", what, r)
		if r.Requests == 0 {
			t.Errorf("%s: the load sent no request", what)
		}
		if r.Failures != 0 {
			t.Errorf("%s: %d failed requests: %s", what, r.Failures, strings.Join(r.Errors, "; "))
		}
	}
}

func appOf(st *api.Status, name string) api.App {
	for _, a := range st.Apps {
		if a.Name == name {
			return a
		}
	}
	return api.App{}
}
