package safeopen

import (
	"os"
	"path/filepath"
	"testing"
)

// benchPath is a file five folders deep, as a log under /tmp/.../a/b/c.
func benchPath(b *testing.B) string {
	dir := filepath.Join(b.TempDir(), "a", "b", "c")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(dir, "web.out.log")
	if err := os.WriteFile(p, []byte("x\n"), 0o640); err != nil {
		b.Fatal(err)
	}
	return p
}

func BenchmarkOpen(b *testing.B) {
	p := benchPath(b)
	run := func(b *testing.B, open func(string) (*os.File, error)) {
		for b.Loop() {
			f, err := open(p)
			if err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	}
	b.Run("os.Open", func(b *testing.B) { run(b, os.Open) })
	b.Run("openat2", func(b *testing.B) { run(b, Open) })
	b.Run("walk", func(b *testing.B) {
		old := noOpenat2.Load()
		noOpenat2.Store(true)
		defer noOpenat2.Store(old)
		run(b, Open)
	})
}
