package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// member is a user created for a test whose primary group is a group
// created with it, the agent's socket_group. Both are removed when the
// test ends.
type member struct {
	Name, Group string
	UID, GID    int
	Cred        *syscall.Credential
}

// newMember creates a user and its group with unique names. It skips the
// test when not root or without useradd/groupadd.
func newMember(t *testing.T) *member {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("privilege tests need root: they create a user and a group and run the agent as root (CI runs as root)")
	}
	for _, tool := range []string{"groupadd", "useradd", "userdel", "groupdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("privilege tests need %s (package passwd): %v", tool, err)
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	m := &member{Name: "dpxu" + suffix, Group: "dpxg" + suffix}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run("groupadd", m.Group)
	t.Cleanup(func() { _ = exec.Command("groupdel", m.Group).Run() })
	run("useradd", "-M", "-N", "-g", m.Group, "-d", "/nonexistent", "-s", "/usr/sbin/nologin", m.Name)
	t.Cleanup(func() { _ = exec.Command("userdel", m.Name).Run() })
	u, err := user.Lookup(m.Name)
	if err != nil {
		t.Fatal(err)
	}
	m.UID, _ = strconv.Atoi(u.Uid)
	m.GID, _ = strconv.Atoi(u.Gid)
	m.Cred = &syscall.Credential{Uid: uint32(m.UID), Gid: uint32(m.GID), Groups: []uint32{}}
	return m
}

// Dir makes a folder the member owns (mode 0755), removed at the end.
func (m *member) Dir(t *testing.T) string {
	t.Helper()
	dir := rootFolder(t, "deployd-member-")
	m.Own(t, dir)
	return dir
}

// rootFolder makes a new folder in the temporary folder, the agent's
// (root's), mode 0755 whatever the umask, removed at the end.
func rootFolder(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Own makes path (recursively) the member's.
func (m *member) Own(t *testing.T, path string) {
	t.Helper()
	err := filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, m.UID, m.GID)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rootOnlyDir makes a folder in a world-readable parent that only root can
// read: mode 0700 with a 0600 secret inside (other members can see it is
// there, not what it holds).
func rootOnlyDir(t *testing.T, mode fs.FileMode) string {
	t.Helper()
	dir := filepath.Join(rootFolder(t, "deployd-rootonly-"), "secret-release")
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, mode)
	CopyFile(t, bins.TestApp, filepath.Join(dir, "server"))
	os.WriteFile(filepath.Join(dir, "run"), []byte("#!/bin/sh\nexec ./server -version stolen\n"), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("root's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tree lists every path under dir with its type and mode, and each file's
// size and mtime: two equal trees mean nothing was written.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		if !fi.IsDir() { // a folder's mtime moves when a staged install is removed from it
			line += fmt.Sprintf(" %d %d", fi.Size(), fi.ModTime().UnixNano())
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// rawAs posts body to path on the agent's socket as cred, as an older CLI
// (or curl) would, and returns the answer. It skips without curl.
func rawAs(t *testing.T, cred *syscall.Credential, socket, path, body string) string {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skipf("needs curl to send a raw request: %v", err)
	}
	cmd := exec.Command("curl", "-sS", "--max-time", "20", "--unix-socket", socket, "-X", "POST",
		"-H", "Content-Type: application/json", "--data", body, "http://deployd"+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := cmd.Run(); err != nil {
		t.Fatalf("curl %s: %v\n%s", path, err, out.String())
	}
	return out.String()
}
