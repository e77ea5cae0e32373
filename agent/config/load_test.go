package config

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deployd/deployd/internal/boundedfile"
)

// allocated runs f and returns the bytes it allocated on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A config file larger than MaxFileSize (here 2 GiB, sparse) is refused
// before it is read, and a FIFO without waiting for a writer.
func TestLoadRefusesOversizedAndSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.toml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string
		is         error
	}{
		{big, "too large (2147483648 bytes, over the limit of 1048576)", boundedfile.ErrTooLarge},
		{fifo, "is a FIFO, not a regular file", boundedfile.ErrNotRegular},
		{"/dev/zero", "is a device, not a regular file", boundedfile.ErrNotRegular},
	} {
		var err error
		t0 := time.Now()
		n := allocated(func() { _, err = Load(tc.path) })
		took := time.Since(t0)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%s) = %v; want %q", tc.path, err, tc.want)
		}
		if n > 1<<20 || took > 5*time.Second {
			t.Errorf("Load(%s) allocated %d bytes in %s; want it refused unread", tc.path, n, took)
		}
		t.Logf("Load(%s): refused in %s, %d bytes allocated", filepath.Base(tc.path), took, n)
	}
}

// What a problem quotes of the file is clipped: a line of almost a
// megabyte with a syntax error, or a key as long, gives a message of a
// few hundred bytes, and thousands of problems are not all listed.
func TestProblemsQuoteLittleOfTheFile(t *testing.T) {
	long := strings.Repeat("x", MaxFileSize-100)
	for _, tc := range []struct{ name, body string }{
		{"syntax error at the end of a long line", "[agent]\nsocket = \"/s\" " + long + "\n"},
		{"syntax error at the start of a long line", "[agent]\n= " + long + "\n"},
		{"long unknown key", "[agent]\n" + long + " = 1\n"},
		{"long value", "[agent]\nupgrade_timeout = \"" + long + "\"\n"},
		{"many unknown keys", "[agent]\n" + manyKeys(5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "deployd.toml")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			var err error
			n := allocated(func() { _, err = Load(p) })
			if err == nil {
				t.Fatal("Load succeeded")
			}
			if msg := err.Error(); len(msg) > 32<<10 {
				t.Errorf("the message is %d bytes; starts %.300q", len(msg), msg)
			} else {
				t.Logf("%d-byte message (%d bytes allocated), first line: %.200s", len(msg), n, strings.SplitN(msg, "\n", 2)[0])
			}
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("unknown_")
		b.WriteString(strings.Repeat("k", i%50))
		b.WriteString(string(rune('a'+i%26)) + "x" + itoa(i) + " = 1\n")
	}
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var s []byte
	for ; i > 0; i /= 10 {
		s = append([]byte{byte('0' + i%10)}, s...)
	}
	return string(s)
}
