package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTailFromWhileWritten checks the junction tailFrom computes while a
// writer appends numbered lines as fast as it can: the line at the offset is
// always the one after the last line returned.
func TestTailFromWhileWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.out.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Whole lines per write, as a Sink writes them.
		var b []byte
		for i := 1; ; i++ {
			b = fmt.Appendf(b, "line %d\n", i)
			if i%50 != 0 {
				continue
			}
			if _, err := f.Write(b); err != nil {
				t.Error(err)
				return
			}
			b = b[:0]
			time.Sleep(10 * time.Microsecond) // a busy log, not a full disk
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	moved := 0
	for deadline := time.Now().Add(10 * time.Second); moved < 100 && time.Now().Before(deadline); {
		lines, from, err := tailFrom(path, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) == 0 {
			continue
		}
		last, err := strconv.Atoi(strings.TrimPrefix(lines[len(lines)-1], "line "))
		if err != nil {
			t.Fatalf("last line %q", lines[len(lines)-1])
		}
		next := readLineAt(t, path, from)
		if next == "" {
			continue // nothing written after it yet
		}
		if next != fmt.Sprintf("line %d", last+1) {
			t.Fatalf("after %q the follow would start at %q", lines[len(lines)-1], next)
		}
		moved++
	}
	if moved < 100 {
		t.Fatalf("only %d checks in 10s", moved)
	}
}

// readLineAt reads the whole line that starts at off ("" if none yet).
func readLineAt(t *testing.T, path string, off int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 256)
	n, err := f.ReadAt(b, off)
	if n == 0 && err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	s, _, ok := strings.Cut(string(b[:n]), "\n")
	if !ok {
		return ""
	}
	return s
}
