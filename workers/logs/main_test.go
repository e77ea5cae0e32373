package logs

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "capture" {
		os.Exit(captureHelper())
	}
	goleak.VerifyTestMain(m)
}

// open opens a Sink on dir/name and closes it when the test ends.
func open(t testing.TB, o Options) *Sink {
	t.Helper()
	s, err := OpenSink(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// flush flushes s, failing the test on error or after a generous timeout
// (a guard against a hang, not a wait for a condition).
func flush(t testing.TB, s *Sink) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// logFiles returns the current file of path and its rotated files, oldest
// first.
func logFiles(t testing.TB, path string) []string {
	t.Helper()
	backups, err := listBackups(path)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, b := range backups {
		files = append(files, b.path)
	}
	sort.Strings(files) // names sort by rotation time
	return append(files, path)
}

// readLines returns the lines of the files, in order.
func readLines(t testing.TB, files ...string) []string {
	t.Helper()
	var lines []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			continue
		}
		if b[len(b)-1] != '\n' {
			t.Fatalf("%s does not end in a newline", f)
		}
		lines = append(lines, strings.Split(string(b[:len(b)-1]), "\n")...)
	}
	return lines
}

func testPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "log", "web.out.log")
}
