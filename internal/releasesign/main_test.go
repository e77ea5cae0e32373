package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"aead.dev/minisign"
)

func TestGenerateSignVerify(t *testing.T) {
	dir := t.TempDir()
	pub, sec, msg := filepath.Join(dir, "k.pub"), filepath.Join(dir, "k.key"), filepath.Join(dir, "deployd")
	var stderr bytes.Buffer
	if err := run([]string{"-G", "-p", pub, "-s", sec}, &stderr); err != nil {
		t.Fatal(err, stderr.String())
	}
	body := []byte("a binary\x00\x01")
	if err := os.WriteFile(msg, body, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-S", "-s", sec, "-m", msg}, &stderr); err != nil {
		t.Fatal(err, stderr.String())
	}
	pubKey, err := minisign.PublicKeyFromFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := os.ReadFile(msg + ".minisig")
	if err != nil {
		t.Fatal(err)
	}
	if !minisign.Verify(pubKey, body, sig) { // how deployd upgrade verifies
		t.Fatalf("signature does not verify:\n%s", sig)
	}
	if minisign.Verify(pubKey, append(body, 'x'), sig) {
		t.Fatal("signature verifies another message")
	}
	if !strings.Contains(string(sig), "file:deployd") {
		t.Errorf("trusted comment does not name the file:\n%s", sig)
	}
	if err := run([]string{"-S", "-m", msg}, &stderr); err == nil {
		t.Error("-S without -s: no error")
	}
}
