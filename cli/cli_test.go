package cli

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

func TestInterspersedMovesFlagsFirst(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	for _, tc := range []struct{ in, want string }{
		{"deployd reload web --json", "deployd reload --json web"},
		{"deployd reload web --strategy blue-green api", "deployd reload --strategy blue-green web api"},
		{"deployd reload web --strategy=blue-green", "deployd reload --strategy=blue-green web"},
		{"deployd scale web -1", "deployd scale web -1"}, // a negative count is an argument
		{"deployd scale web +2 --json", "deployd scale --json web +2"},
		{"deployd reload -- web --json", "deployd reload -- web --json"}, // "--" ends the flags
		{"deployd startup systemd --print -c x.toml", "deployd startup systemd --print -c x.toml"},
		{"deployd nosuchcommand a --b", "deployd nosuchcommand a --b"},
		{"deployd", "deployd"},
	} {
		if got := strings.Join(interspersed(app, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("interspersed(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestExitCodeOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fail(ExitFailed, "abandoned"), ExitFailed},
		{fmt.Errorf("wrapped: %w", fail(ExitUsage, "bad")), ExitUsage},
		{&api.UnreachableError{Socket: "s", Err: errors.New("refused")}, ExitUnreachable},
		{&api.TransportError{Socket: "s", Err: errors.New("eof")}, ExitUnreachable},
		{&api.TransportError{Socket: "s", Err: errors.New("eof"), Midway: true}, ExitFailed},
		{&api.StatusError{Code: http.StatusBadRequest}, ExitUsage},
		{&api.StatusError{Code: http.StatusNotFound}, ExitUsage},
		{&api.StatusError{Code: http.StatusConflict}, ExitFailed},
		{&api.StatusError{Code: http.StatusInternalServerError}, ExitFailed},
		{errors.New("flag provided but not defined: -x"), ExitUsage},
	} {
		if got := exitCodeOf(tc.err); got != tc.want {
			t.Errorf("exitCodeOf(%T %v) = %d, want %d", tc.err, tc.err, got, tc.want)
		}
	}
}

func TestMainExitCodes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "none.sock")
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"--help"}, ExitOK, ""},
		{[]string{"status", "--no-such-flag"}, ExitUsage, "no-such-flag"},
		{[]string{"status", "--socket", sock}, ExitUnreachable, sock},
		{[]string{"reload", "web", "--socket", sock}, ExitUnreachable, sock},
		{[]string{"config", "check", "-c", filepath.Join(dir, "missing.toml")}, ExitUsage, "missing.toml"},
	} {
		var out, errb bytes.Buffer
		code := Main(append([]string{"deployd"}, tc.args...), &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("deployd %v: exit %d, stderr %q; want exit %d, stderr with %q", tc.args, code, errb.String(), tc.code, tc.stderr)
		}
	}
}

func TestFormatting(t *testing.T) {
	for _, tc := range []struct {
		sec  float64
		want string
	}{{0.4, "0s"}, {59.6, "1m0s"}, {61, "1m1s"}, {3 * 3600, "3h0m0s"}, {47*3600 + 61, "47h1m0s"}, {3 * 86400, "3d"}} {
		if got := fmtDuration(tc.sec); got != tc.want {
			t.Errorf("fmtDuration(%v) = %q, want %q", tc.sec, got, tc.want)
		}
	}
	for _, tc := range []struct {
		b    int64
		want string
	}{{0, "0B"}, {1023, "1023B"}, {1024, "1.0KiB"}, {1536, "1.5KiB"}, {20 << 20, "20.0MiB"}, {3 << 30, "3.0GiB"}} {
		if got := fmtBytes(tc.b); got != tc.want {
			t.Errorf("fmtBytes(%d) = %q, want %q", tc.b, got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"/usr/bin/app", "/usr/bin/app"}, {"50%", "50%%"}, {"$HOME", "$$HOME"},
		{"a b", `"a b"`}, {`say "hi"`, `"say \"hi\""`}, {`c:\x`, `"c:\\x"`},
	} {
		if got := execArg(tc.in); got != tc.want {
			t.Errorf("execArg(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := unitPart("web app/é.1"); got != "web_app__.1" {
		t.Errorf("unitPart = %q", got)
	}
	for s, ok := range map[string]bool{"deployd": true, "my-app.v2": true, "": false, ".hidden": false, "a b": false} {
		if validUnitPrefix(s) != ok {
			t.Errorf("validUnitPrefix(%q) = %v", s, !ok)
		}
	}
}

func TestPrintEventsAndSummary(t *testing.T) {
	var b bytes.Buffer
	for _, e := range []api.Event{
		{App: "web", Type: "started", Slot: 1, PID: 42, Release: "r1"},
		{App: "web", Type: "ready", Slot: 1, PID: 42, Millis: 120},
		{App: "web", Type: "draining", Slot: 1, PID: 41},
		{App: "web", Type: "exited", Slot: 0, PID: 40, Millis: 7, Message: "exit status 1"},
		{App: "web", Type: "failed", Slot: 0, PID: 43, Message: "not ready within 10s"},
		{App: "web", Type: "abandoned", Message: "old workers keep serving"},
	} {
		printEvent(&b, e)
	}
	printSummary(&b, "reload", &api.Result{Apps: []api.AppResult{
		{App: "web", Outcome: api.OutcomeDone, DurationSeconds: 1.2345, Release: "r1"},
		{App: "api", Outcome: api.OutcomeAbandoned, DurationSeconds: 2, Error: "worker 0 exited",
			ExitStatus: "exit status 3", LastLines: []string{"boom\r", "bye"}},
	}})
	want := []string{
		"web[1]: started pid 42, release r1",
		"web[1]: pid 42 ready after 120 ms",
		"web[1]: old pid 41 draining",
		"web[0]: pid 40 exited after 7 ms (exit status 1)",
		"web[0]: pid 43 failed: not ready within 10s",
		"web: abandoned old workers keep serving",
		"web: reload done in 1.235s, release r1",
		"api: reload abandoned after 2s: worker 0 exited",
		"  new worker: exit status 3",
		"  its last output:",
		"  | boom",
		"  | bye",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); !slices.Equal(got, want) {
		t.Errorf("output:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// config check says that a Node.js app of releases with no listen list
// fails its first deploy when it listens on a port (deployd learns a port
// from the app's own listen only for an app run from its config folder).
func TestConfigCheckNotesReleasesWithoutListen(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "deployd.toml")
	body := "[agent]\nsocket = " + strconv.Quote(filepath.Join(dir, "none.sock")) + "\nstate_dir = \"state\"\nlog_dir = \"logs\"\n\n" +
		"[apps.rel]\ncommand = [\"node\", \"server.js\"]\nreleases = true\n\n" +
		"[apps.web]\ncommand = [\"node\", \"server.js\"]\nreleases = true\nlisten = [\"tcp://127.0.0.1:39999\"]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"deployd", "config", "check", "-c", cfg, "--socket", filepath.Join(dir, "none.sock")}, &out, &errb); code != ExitOK {
		t.Fatalf("config check: exit %d\n%s%s", code, out.String(), errb.String())
	}
	want := `app rel has releases = true and no listen list: deployd does not learn a release's port from its listen call, ` +
		`so a release that listens on a port fails its first deploy; add listen = ["tcp://0.0.0.0:PORT"] to [apps.rel]`
	if !strings.Contains(out.String(), want) {
		t.Errorf("config check does not say %q:\n%s", want, out.String())
	}
	if strings.Contains(out.String(), "app web has releases") {
		t.Errorf("config check notes an app with a listen list:\n%s", out.String())
	}
}
