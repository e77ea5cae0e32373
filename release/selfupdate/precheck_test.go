package selfupdate

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"aead.dev/minisign"
)

// A candidate the checks refuse whatever its bytes (a member's upgrade
// with no key to check its signature, a key and no signature) is refused
// before a byte of it is read: here a sparse executable of MaxBinary bytes.
func TestPrepareRefusesBeforeReading(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	f, err := os.OpenFile(big, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxBinary); err != nil {
		t.Fatal(err)
	}
	f.Close()
	target := filepath.Join(dir, "deployd")
	if err := os.WriteFile(target, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pub, _, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pub.MarshalText()
	for _, tc := range []struct {
		name string
		c    Check
		want Problem
	}{
		{"member, no key", Check{RequireSignature: true}, NoPublicKey},
		{"signature, no key", Check{Signature: []byte("sig")}, NoPublicKey},
		{"key, no signature", Check{PublicKey: string(key)}, SignatureRequired},
		{"bad sha256", Check{SHA256: "xyz"}, ChecksumFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := os.Open(big)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = Prepare(src, target, tc.c)
			runtime.ReadMemStats(&after)
			var re *RefusedError
			if !errors.As(err, &re) || re.Problem != tc.want {
				t.Fatalf("Prepare = %v; want %s", err, tc.want)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("Prepare allocated %d bytes before refusing", n)
			}
			if off, _ := src.Seek(0, 1); off != 0 {
				t.Errorf("Prepare read %d bytes of the candidate before refusing", off)
			}
		})
	}
}
