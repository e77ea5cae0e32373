// Package selfupdate replaces the agent's own binary (apart from app
// releases, which package release keeps). It reads a candidate from a file
// the caller opened, verifies its sha256 and minisign signature, writes the
// verified bytes beside the agent's binary through minio/selfupdate, runs
// that written copy's `version` and only then swaps it in, keeping a backup.
// Nothing of the candidate runs before it is verified.
package selfupdate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"aead.dev/minisign"
	"github.com/minio/selfupdate"
)

// MaxBinary bounds the size of a candidate binary, which is read into
// memory to be verified (a deployd binary is about 14 MiB).
const MaxBinary = 128 << 20

// ErrBadBinary is wrapped by every refusal of a candidate (a *RefusedError).
var ErrBadBinary = errors.New("selfupdate: new binary refused")

// Problem says why a candidate was refused; callers word it for a person.
type Problem string

// Problems of a candidate.
const (
	NotRegular        Problem = "not-regular"
	NotExecutable     Problem = "not-executable"
	TooLarge          Problem = "too-large"
	Unreadable        Problem = "unreadable"
	ChecksumFormat    Problem = "checksum-format"
	ChecksumMismatch  Problem = "checksum-mismatch"
	SignatureRequired Problem = "signature-required"
	NoPublicKey       Problem = "no-public-key"
	BadSignature      Problem = "bad-signature"
	ProbeFailed       Problem = "probe-failed"
)

// RefusedError is a refused candidate; nothing of it ran or was installed.
type RefusedError struct {
	Problem Problem
	Detail  string
}

func (e *RefusedError) Error() string        { return e.Detail }
func (e *RefusedError) Is(target error) bool { return target == ErrBadBinary }

func refuse(p Problem, format string, args ...any) error {
	return &RefusedError{Problem: p, Detail: fmt.Sprintf(format, args...)}
}

// Check is what a candidate must pass.
type Check struct {
	SHA256    string // expected sha256 in hex; "" = not checked
	Signature []byte // minisign signature of the binary
	PublicKey string // [agent] upgrade_public_key; a signature is then required
	// RequireSignature refuses a candidate without a signature that
	// verifies with PublicKey even when the caller would not need one
	// (a socket_group member's upgrade).
	RequireSignature bool
	ProbeTimeout     time.Duration
}

// Candidate is a verified binary written beside its target, not yet in place.
type Candidate struct {
	Target  string
	SHA256  []byte
	Version string // what `version` printed
}

// Staged is where Prepare writes the candidate for target.
func Staged(target string) string {
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".new")
}

// Backup is where Commit keeps the previous binary.
func Backup(target string) string {
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".old")
}

// Prepare reads a candidate from src (the caller's open file), verifies
// it, writes exactly the verified bytes to Staged(target) (target's folder
// must be writable by the agent only) and runs `version` on that file. On
// any error nothing is left behind and nothing of src has run.
func Prepare(src *os.File, target string, c Check) (*Candidate, error) {
	if err := c.Precheck(); err != nil {
		return nil, err
	}
	data, err := readCandidate(src)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	if err := c.verify(data, sum[:]); err != nil {
		return nil, err
	}
	fi, err := os.Stat(target)
	if err != nil {
		return nil, fmt.Errorf("selfupdate: %w", err)
	}
	staged := Staged(target)
	_ = os.Remove(staged) // never write through what a crash left
	opts := selfupdate.Options{TargetPath: target, TargetMode: fi.Mode().Perm(), Checksum: sum[:]}
	if err := selfupdate.PrepareAndCheckBinary(bytes.NewReader(data), opts); err != nil {
		os.Remove(staged)
		return nil, fmt.Errorf("selfupdate: write %s: %w", staged, err)
	}
	if err := fsyncFile(staged); err != nil {
		os.Remove(staged)
		return nil, fmt.Errorf("selfupdate: %w", err)
	}
	ver, err := probeVersion(staged, c.ProbeTimeout)
	if err != nil {
		os.Remove(staged)
		return nil, refuse(ProbeFailed, "%v", err)
	}
	return &Candidate{Target: target, SHA256: sum[:], Version: ver}, nil
}

// readCandidate reads src: a regular, executable file of at most MaxBinary.
func readCandidate(src *os.File) ([]byte, error) {
	fi, err := src.Stat()
	switch {
	case err != nil:
		return nil, refuse(Unreadable, "the new binary: %v", err)
	case !fi.Mode().IsRegular():
		return nil, refuse(NotRegular, "the new binary is not a regular file")
	case fi.Mode()&0o111 == 0:
		return nil, refuse(NotExecutable, "the new binary is not executable")
	case fi.Size() > MaxBinary:
		return nil, refuse(TooLarge, "the new binary is over %d bytes", MaxBinary)
	}
	data, err := io.ReadAll(io.LimitReader(src, MaxBinary+1))
	if err != nil {
		return nil, refuse(Unreadable, "read the new binary: %v", err)
	}
	if len(data) > MaxBinary {
		return nil, refuse(TooLarge, "the new binary is over %d bytes", MaxBinary)
	}
	return data, nil
}

// Precheck refuses what needs no byte of the candidate to refuse: a
// malformed sha256, a signature required with no key to check it, a key
// set and no signature. Callers run it before they read (or wait for)
// the candidate; Prepare runs it too.
func (c Check) Precheck() error {
	if c.SHA256 != "" {
		if want, err := hex.DecodeString(strings.TrimSpace(c.SHA256)); err != nil || len(want) != sha256.Size {
			return refuse(ChecksumFormat, "the expected sha256 %q is not 64 hex digits", c.SHA256)
		}
	}
	if c.PublicKey == "" && c.RequireSignature {
		return refuse(NoPublicKey, "this caller's upgrade needs a signature, and the agent has no [agent] upgrade_public_key to check one")
	}
	if c.PublicKey == "" && len(c.Signature) > 0 {
		return refuse(NoPublicKey, "a signature was given but the agent has no [agent] upgrade_public_key to check it with")
	}
	if c.PublicKey != "" && len(c.Signature) == 0 {
		return refuse(SignatureRequired, "a minisign signature is required ([agent] upgrade_public_key is set)")
	}
	return nil
}

func (c Check) verify(data, sum []byte) error {
	if err := c.Precheck(); err != nil {
		return err
	}
	if c.SHA256 != "" {
		want, _ := hex.DecodeString(strings.TrimSpace(c.SHA256))
		if !bytes.Equal(want, sum) {
			return refuse(ChecksumMismatch, "sha256 mismatch: the new binary has %x, expected %x", sum, want)
		}
	}
	if c.PublicKey == "" && c.RequireSignature {
		return refuse(NoPublicKey, "this caller's upgrade needs a signature, and the agent has no [agent] upgrade_public_key to check one")
	}
	if c.PublicKey == "" && len(c.Signature) > 0 {
		return refuse(NoPublicKey, "a signature was given but the agent has no [agent] upgrade_public_key to check it with")
	}
	if c.PublicKey == "" {
		return nil
	}
	if len(c.Signature) == 0 {
		return refuse(SignatureRequired, "a minisign signature is required ([agent] upgrade_public_key is set)")
	}
	var pub minisign.PublicKey
	if err := pub.UnmarshalText([]byte(c.PublicKey)); err != nil {
		return fmt.Errorf("selfupdate: upgrade_public_key: %w", err)
	}
	if !minisign.Verify(pub, data, c.Signature) {
		return refuse(BadSignature, "the signature does not verify with upgrade_public_key")
	}
	return nil
}

// probeVersion runs `path version` against no agent and returns the version.
func probeVersion(path string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []byte
	var err error
	// The staged file was just written: a fork elsewhere in the agent (a
	// worker starting) may still hold the write descriptor until its exec,
	// and exec fails with ETXTBSY meanwhile (golang/go#22315). Retry a while.
	for try := 0; ; try++ {
		cmd := exec.CommandContext(ctx, path, "version", "--socket", "/nonexistent/deployd-probe.sock")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DEPLOYD_CONFIG=/nonexistent/deployd.toml"}
		cmd.WaitDelay = time.Second
		out, err = cmd.Output()
		if !errors.Is(err, syscall.ETXTBSY) || try == 50 || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ctx.Err() != nil {
		return "", fmt.Errorf("the new binary's `version` did not answer within %s", timeout)
	}
	if err != nil {
		return "", fmt.Errorf("the new binary's `version` failed (%w); is it a deployd binary for this machine?", err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	ver, ok := strings.CutPrefix(first, "deployd ")
	if !ok || ver == "" {
		return "", fmt.Errorf("the new binary's `version` printed %q, not a deployd version", first)
	}
	return ver, nil
}

// Commit puts the candidate in place of its target, keeping the previous
// binary at Backup(target) for Restore: the old one is hard linked to the
// backup, then one rename replaces target, so target always names a
// complete binary, even across a crash.
func (c *Candidate) Commit() error {
	backup := Backup(c.Target)
	_ = os.Remove(backup)
	if err := os.Link(c.Target, backup); err != nil {
		c.Discard()
		return fmt.Errorf("selfupdate: keep a backup of %s: %w", c.Target, err)
	}
	if err := os.Rename(Staged(c.Target), c.Target); err != nil {
		c.Discard()
		return fmt.Errorf("selfupdate: swap %s: %w", c.Target, err)
	}
	syncDir(filepath.Dir(c.Target))
	return nil
}

// Discard removes a candidate that is not to be committed.
func (c *Candidate) Discard() { os.Remove(Staged(c.Target)) }

// Restore puts the previous binary back after a failed handoff.
func Restore(target string) error {
	if err := os.Rename(Backup(target), target); err != nil {
		return fmt.Errorf("selfupdate: restore %s from %s: %w", target, Backup(target), err)
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

// syncDir makes renames in dir durable.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
