package selfupdate

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"aead.dev/minisign"
)

// candidate writes a script that records every run in marker and poses as
// deployd, and returns it opened, as the client would pass it.
func candidate(t *testing.T, marker string) (*os.File, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cand")
	body := []byte(fmt.Sprintf("#!/bin/sh\necho \"$0\" >> %s\necho deployd cand-1\n", marker))
	if err := os.WriteFile(p, body, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, body
}

func target(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "deployd")
	if err := os.WriteFile(p, []byte("old binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A refused candidate never runs and leaves nothing beside the target.
func TestRefusedCandidateNeverRuns(t *testing.T) {
	pub, _, _ := minisign.GenerateKey(rand.Reader)
	_, otherPriv, _ := minisign.GenerateKey(rand.Reader)
	pubText, _ := pub.MarshalText()
	for _, tc := range []struct {
		name    string
		check   func(body []byte) Check
		problem Problem
	}{
		{"member without a key", func([]byte) Check { return Check{RequireSignature: true} }, NoPublicKey},
		{"signature required", func([]byte) Check { return Check{PublicKey: string(pubText)} }, SignatureRequired},
		{"other key", func(b []byte) Check {
			return Check{PublicKey: string(pubText), Signature: minisign.Sign(otherPriv, b)}
		}, BadSignature},
		{"checksum", func([]byte) Check { return Check{SHA256: fmt.Sprintf("%x", sha256.Sum256([]byte("x")))} }, ChecksumMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "runs")
			f, body := candidate(t, marker)
			tgt := target(t)
			c := tc.check(body)
			c.ProbeTimeout = 5 * time.Second
			_, err := Prepare(f, tgt, c)
			var re *RefusedError
			if !errors.As(err, &re) || re.Problem != tc.problem || !errors.Is(err, ErrBadBinary) {
				t.Fatalf("got %v, want a %s refusal", err, tc.problem)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Errorf("the refused candidate ran: %s", b)
			}
			if _, err := os.Stat(Staged(tgt)); err == nil {
				t.Error("a refused candidate was left at", Staged(tgt))
			}
		})
	}
}

// A verified candidate runs only as the staged copy, which Commit installs.
func TestVerifiedCandidateProbedAsTheStagedCopy(t *testing.T) {
	pub, priv, _ := minisign.GenerateKey(rand.Reader)
	pubText, _ := pub.MarshalText()
	marker := filepath.Join(t.TempDir(), "runs")
	f, body := candidate(t, marker)
	tgt := target(t)
	c, err := Prepare(f, tgt, Check{PublicKey: string(pubText), Signature: minisign.Sign(priv, body),
		RequireSignature: true, ProbeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != "cand-1" {
		t.Errorf("version %q", c.Version)
	}
	if runs, _ := os.ReadFile(marker); string(runs) != Staged(tgt)+"\n" {
		t.Errorf("runs %q, want only the staged copy %s", runs, Staged(tgt))
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(tgt); string(b) != string(body) {
		t.Errorf("target holds %q", b)
	}
	if b, _ := os.ReadFile(Backup(tgt)); string(b) != "old binary" {
		t.Errorf("backup holds %q", b)
	}
	if err := Restore(tgt); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(tgt); string(b) != "old binary" {
		t.Errorf("after Restore the target holds %q", b)
	}
}
