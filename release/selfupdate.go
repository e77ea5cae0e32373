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
	// data is what was verified; Swap installs exactly these bytes, so a
	// file changed after the check cannot slip in.
	data []byte
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
	ver, err := probeCopy(data, path, probeTimeout)
	if err != nil {
		return nil, refuse("%v", err)
	}
	return &Binary{Path: path, SHA256: sum[:], Version: ver, data: data}, nil
}

// probeCopy runs `version` on a private copy of the verified bytes (not on
// path, which its owner could change after the check).
func probeCopy(data []byte, path string, timeout time.Duration) (string, error) {
	dir, err := os.MkdirTemp("", "deployd-probe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	exe := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(exe, data, 0o700); err != nil {
		return "", err
	}
	ver, err := probeVersion(exe, timeout)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return ver, nil
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
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DEPLOYD_CONFIG=/nonexistent/deployd.toml"}
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return "", fmt.Errorf("`version` did not answer within %s", timeout)
	}
	if err != nil {
		return "", fmt.Errorf("`version` failed (%w); is it a deployd binary for this machine?", err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	ver, ok := strings.CutPrefix(first, "deployd ")
	if !ok || ver == "" {
		return "", fmt.Errorf("`version` printed %q, not a deployd version", first)
	}
	return ver, nil
}

// Swap replaces the binary at target with b, keeping the previous one at
// Backup(target) so that Restore can put it back. minio/selfupdate writes and
// checks the new file beside target; it is fsynced, the old one is hard
// linked to the backup, and one rename replaces target, so target always
// names a complete binary, even across a crash.
func Swap(b *Binary, target string) error {
	fi, err := os.Stat(target)
	if err != nil {
		return err
	}
	opts := selfupdate.Options{TargetPath: target, TargetMode: fi.Mode().Perm(), Checksum: b.SHA256}
	if err := selfupdate.PrepareAndCheckBinary(bytes.NewReader(b.data), opts); err != nil {
		return fmt.Errorf("swap %s: %w", target, err)
	}
	newPath := filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".new")
	if err := fsyncFile(newPath); err != nil {
		os.Remove(newPath)
		return fmt.Errorf("swap %s: %w", target, err)
	}
	backup := Backup(target)
	_ = os.Remove(backup)
	if err := os.Link(target, backup); err != nil {
		os.Remove(newPath)
		return fmt.Errorf("swap %s: keep a backup: %w", target, err)
	}
	if err := os.Rename(newPath, target); err != nil {
		os.Remove(newPath)
		return fmt.Errorf("swap %s: %w", target, err)
	}
	syncDir(filepath.Dir(target))
	return nil
}

func fsyncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
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
