package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tarGzOf is a .tar.gz holding one file of size bytes of content from fill.
func tarGzOf(t *testing.T, size int64, fill func([]byte)) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "data", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(chunk)) {
		fill(chunk)
		tw.Write(chunk[:min(int64(len(chunk)), left)])
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// A tarball that unpacks to over maxRatio times its compressed size is
// refused once past the floor (here lowered to 1 MiB), and its staging
// folder goes; one that compresses as releases do is installed.
func TestExtractRefusesDecompressionBombs(t *testing.T) {
	defer func(f int64) { ratioFloor = f }(ratioFloor)
	ratioFloor = 1 << 20
	zeros := tarGzOf(t, 64<<20, func(b []byte) { clear(b) })
	dst := t.TempDir()
	err := Extract(bytes.NewReader(zeros), dst)
	if err == nil || !strings.Contains(err.Error(), "decompression bomb") {
		t.Fatalf("Extract of %d bytes that unpack to 64 MiB: %v; want a refusal", len(zeros), err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "data")); err == nil && fi.Size() > 2<<20 {
		t.Errorf("wrote %d bytes before refusing", fi.Size())
	}

	s := &Store{Dir: t.TempDir()}
	art := filepath.Join(t.TempDir(), "bomb.tar.gz")
	os.WriteFile(art, zeros, 0o644)
	if _, err := s.Install("web", art, "1", ""); !errors.Is(err, ErrBadArtifact) {
		t.Fatalf("Install of a bomb: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir, "web")); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}

	random := tarGzOf(t, 4<<20, func(b []byte) { rand.Read(b) })
	if err := Extract(bytes.NewReader(random), t.TempDir()); err != nil {
		t.Errorf("Extract of 4 MiB that do not compress: %v", err)
	}
	text := tarGzOf(t, 4<<20, func(b []byte) { // about 10:1, as source text
		for i := range b {
			b[i] = "the quick brown fox jumps over the lazy dog\n"[i%44]
		}
		rand.Read(b[:len(b)/10])
	})
	if err := Extract(bytes.NewReader(text), t.TempDir()); err != nil {
		t.Errorf("Extract of 4 MiB of %d bytes: %v", len(text), err)
	}
}
