package logs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/deployd/deployd/internal/safeopen"
)

// rootSecret is a 0600 file in a 0700 folder beside the log folder: what
// an app user who could write the log folder would point a link at.
func rootSecret(t *testing.T, path string) string {
	t.Helper()
	dir := filepath.Join(filepath.Dir(filepath.Dir(path)), "root-only")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return secret
}

func unchanged(t *testing.T, secret string) {
	t.Helper()
	if b, err := os.ReadFile(secret); err != nil || string(b) != "root's secret\n" {
		t.Errorf("the link's target was written: %q, %v", b, err)
	}
}

// A link put in place of the current log file is neither written through
// (at open, or after a rotation) nor read through; nor is a log folder
// swapped for a link.
func TestLogFilesFollowNoLink(t *testing.T) {
	path := testPath(t)
	secret := rootSecret(t, path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, path); err != nil {
		t.Fatal(err)
	}
	if s, err := OpenSink(Options{Path: path}); err == nil {
		s.Close()
		t.Fatal("a sink opened a link as its log file")
	} else if !errors.Is(err, safeopen.ErrSymlink) {
		t.Errorf("OpenSink on a link: %v, want a symlink refusal", err)
	}
	if lines, err := LastLines(path, 10); err == nil {
		t.Errorf("LastLines read through a link: %q", lines)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Follow(ctx, path, 0, func(l string) { t.Errorf("Follow read %q through a link", l) }); err == nil {
		t.Error("Follow of a link: no error")
	}

	// Swapped while the sink runs: the rotation moves the link itself
	// aside (a rename follows no link) and starts a file of its own.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s := open(t, Options{Path: path})
	s.Write(Line{App: "web", Stream: "out", Text: "before"})
	flush(t, s)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, path); err != nil {
		t.Fatal(err)
	}
	if err := s.Rotate(); err != nil {
		t.Fatal(err)
	}
	s.Write(Line{App: "web", Stream: "out", Text: "after"})
	flush(t, s)
	unchanged(t, secret)
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("after the rotation the log is %v, %v; want a regular file", fi, err)
	}
	if lines, err := LastLines(path, 10); err != nil || len(lines) != 1 {
		t.Errorf("the new log file holds %q, %v; want the one line written after", lines, err)
	}

	// The whole folder swapped for a link into the root-only folder.
	dir := filepath.Dir(path)
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(secret), dir); err != nil {
		t.Fatal(err)
	}
	if lines, err := LastLines(filepath.Join(dir, "secret"), 10); err == nil {
		t.Errorf("LastLines read through a linked folder: %q", lines)
	}
	unchanged(t, secret)
}
