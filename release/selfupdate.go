// Package release manages what runs: releases of apps on disk, and the
// agent's own binary, which it verifies and swaps in through
// minio/selfupdate before a handoff. It never starts workers.
package release

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/selfupdate"
)

// ErrBadBinary is wrapped by every refusal of a new agent binary.
var ErrBadBinary = errors.New("release: new binary refused")

// Binary is a candidate agent binary, verified by CheckBinary.
type Binary struct {
	Path    string
	SHA256  []byte
	Version string // what `BINARY version` printed
}

// CheckBinary verifies the file at path: a regular executable file, whose
// sha256 matches wantSHA256 (hex, optional), whose minisign signature in
// sigPath verifies with publicKey (required when publicKey is set), and that
// runs: `path version` must answer within probeTimeout.
func CheckBinary(path, wantSHA256, sigPath, publicKey string, probeTimeout time.Duration) (*Binary, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadBinary, fmt.Sprintf(format, args...))
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, refuse("%s: %v", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, refuse("%s is not a regular file", path)
	}
	if fi.Mode()&0o111 == 0 {
		return nil, refuse("%s is not executable; chmod +x it", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, refuse("read %s: %v", path, err)
	}
	sum := sha256.Sum256(data)
	if wantSHA256 != "" {
		want, err := hex.DecodeString(strings.TrimSpace(wantSHA256))
		if err != nil || len(want) != sha256.Size {
			return nil, refuse("--sha256 %q is not 64 hex digits", wantSHA256)
		}
		if !bytes.Equal(want, sum[:]) {
			return nil, refuse("sha256 mismatch: %s has %x, expected %x", path, sum, want)
		}
	}
	if publicKey != "" || sigPath != "" {
		if err := verifySignature(data, sigPath, publicKey); err != nil {
			return nil, refuse("%v", err)
		}
	}
	ver, err := probeVersion(path, probeTimeout)
	if err != nil {
		return nil, refuse("%v", err)
	}
	return &Binary{Path: path, SHA256: sum[:], Version: ver}, nil
}

func verifySignature(data []byte, sigPath, publicKey string) error {
	switch {
	case publicKey == "":
		return errors.New("--signature given but the agent has no [agent] upgrade_public_key to check it with")
	case sigPath == "":
		return errors.New("a minisign signature is required ([agent] upgrade_public_key is set): pass --signature FILE")
	}
	v := selfupdate.NewVerifier()
	if err := v.LoadFromFile(sigPath, publicKey); err != nil {
		return fmt.Errorf("signature %s: %v", sigPath, err)
	}
	if err := v.Verify(data); err != nil {
		return fmt.Errorf("signature %s does not verify with upgrade_public_key: %v", sigPath, err)
	}
	return nil
}

// probeVersion runs `path version` against no agent and returns the version.
func probeVersion(path string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "version", "--socket", "/nonexistent/deployd-probe.sock")
	cmd.Env = append(os.Environ(), "DEPLOYD_CONFIG=/nonexistent/deployd.toml")
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return "", fmt.Errorf("%s version did not answer within %s", path, timeout)
	}
	if err != nil {
		return "", fmt.Errorf("%s version failed (%v); is it a deployd binary for this machine?", path, err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	ver, ok := strings.CutPrefix(first, "deployd ")
	if !ok || ver == "" {
		return "", fmt.Errorf("%s version printed %q, not a deployd version", path, first)
	}
	return ver, nil
}

// Swap replaces the binary at target with b atomically (rename), keeping the
// previous one at Backup(target) so that Restore can put it back.
func Swap(b *Binary, target string) error {
	f, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := os.Stat(target)
	if err != nil {
		return err
	}
	err = selfupdate.Apply(f, selfupdate.Options{
		TargetPath: target, TargetMode: fi.Mode().Perm(), Checksum: b.SHA256, OldSavePath: Backup(target),
	})
	if rerr := selfupdate.RollbackError(err); rerr != nil {
		return fmt.Errorf("swap %s: %v; rollback failed too: %v: restore %s by hand", target, err, rerr, Backup(target))
	}
	if err != nil {
		return fmt.Errorf("swap %s: %w", target, err)
	}
	syncDir(filepath.Dir(target))
	return nil
}

// Backup is where Swap keeps the previous binary.
func Backup(target string) string {
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".old")
}

// Restore puts the previous binary back after a failed handoff.
func Restore(target string) error {
	if err := os.Rename(Backup(target), target); err != nil {
		return fmt.Errorf("restore %s from %s: %w", target, Backup(target), err)
	}
	syncDir(filepath.Dir(target))
	return nil
}

// syncDir makes renames in dir durable.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
