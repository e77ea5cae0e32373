package release

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// installed installs a one-file release of web as version into a new store.
func installed(t *testing.T, version string) (*Store, *Release) {
	t.Helper()
	s := &Store{Dir: t.TempDir()}
	art := filepath.Join(t.TempDir(), "server")
	if err := os.WriteFile(art, []byte("#!/bin/sh\necho "+version+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := s.Install("web", art, version, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, rel
}

// within runs f and fails the test when it has not returned after 10 s (a
// read blocked on a FIFO never returns).
func returnsWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10s (blocked on a FIFO?)", what)
	}
}

// The release folder may belong to the app's user (a before hook runs
// there): whatever that user puts in it as the release's record, a FIFO,
// a link to /dev/zero or a forged record, the agent neither blocks, nor
// grows, nor believes it. Its own record is elsewhere.
func TestReleaseFolderRecordIsNotTrusted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(path string) error
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o666) }},
		{"link to /dev/zero", func(p string) error { return os.Symlink("/dev/zero", p) }},
		{"forged", func(p string) error {
			return os.WriteFile(p, []byte(`{"app":"web","version":"1.0.0","sha256":"forged"}`), 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, rel := installed(t, "1.0.0")
			p := filepath.Join(rel.Path, legacyRecord)
			os.Remove(p)
			if err := tc.plant(p); err != nil {
				t.Fatal(err)
			}
			var got *Release
			var list []*Release
			var err, lerr error
			returnsWithin(t, "Get and List", func() {
				got, err = s.Get("web", "1.0.0")
				list, lerr = s.List("web")
			})
			if err != nil || got.SHA256 != rel.SHA256 {
				t.Errorf("Get = %+v, %v; want the agent's record (sha256 %s)", got, err, rel.SHA256)
			}
			if lerr != nil || len(list) != 1 || list[0].SHA256 != rel.SHA256 {
				t.Errorf("List = %v, %v; want the one release as recorded", list, lerr)
			}
		})
	}
}

// A release installed before the records moved keeps its record in its
// folder: it is read once (bounded, no FIFO, no link) and copied to the
// agent's place; a FIFO or a link there is refused without blocking.
func TestLegacyRecordMigratedBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(path string, rec []byte) error
		ok    bool
	}{
		{"regular", func(p string, rec []byte) error { return os.WriteFile(p, rec, 0o644) }, true},
		{"fifo", func(p string, _ []byte) error { return syscall.Mkfifo(p, 0o666) }, false},
		{"link to /dev/zero", func(p string, _ []byte) error { return os.Symlink("/dev/zero", p) }, false},
		{"other version", func(p string, _ []byte) error {
			return os.WriteFile(p, []byte(`{"app":"web","version":"2.0.0"}`), 0o644)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, rel := installed(t, "1.0.0")
			rec, _ := json.Marshal(rel)
			os.Remove(s.recordPath("web", "1.0.0")) // as an older agent left it
			if err := tc.plant(filepath.Join(rel.Path, legacyRecord), rec); err != nil {
				t.Fatal(err)
			}
			var got *Release
			var err error
			returnsWithin(t, "Get", func() { got, err = s.Get("web", "1.0.0") })
			if !tc.ok {
				if err == nil {
					t.Fatalf("Get = %+v; want a refusal", got)
				}
				return
			}
			if err != nil || got.SHA256 != rel.SHA256 {
				t.Fatalf("Get = %+v, %v", got, err)
			}
			if _, err := os.Stat(s.recordPath("web", "1.0.0")); err != nil {
				t.Errorf("the record was not copied to the agent's place: %v", err)
			}
		})
	}
}

// A version from a client (rollback --to) is a folder name of the store:
// "../../x" is refused before anything is read, even when x holds what
// looks like a release.
func TestGetRefusesTraversal(t *testing.T) {
	s, _ := installed(t, "1.0.0")
	outside := filepath.Join(s.Dir, "..", "x")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(outside, legacyRecord), []byte(`{"app":"web","version":"../../x"}`), 0o644)
	for _, v := range []string{"../../x", "..", ".", "", "a/b", ".records", "/etc"} {
		rel, err := s.Get("web", v)
		var re *RefusedError
		if !errors.As(err, &re) || re.Problem != BadVersion {
			t.Errorf("Get(web, %q) = %+v, %v; want a BadVersion refusal", v, rel, err)
		}
	}
	// A link in the store named like a version is not a release either.
	if err := os.Symlink(outside, s.Path("web", "2.0.0")); err != nil {
		t.Fatal(err)
	}
	if rel, err := s.Get("web", "2.0.0"); err == nil {
		t.Errorf("Get through a link = %+v; want an error", rel)
	}
}

// Staging folders that an install cut short left are removed; one an
// install still holds is not.
func TestRemoveLeftoversSparesHeldStaging(t *testing.T) {
	s, _ := installed(t, "1.0.0")
	left := filepath.Join(s.Dir, "web", tmpPrefix+"left")
	if err := os.MkdirAll(filepath.Join(left, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, cleanup, err := s.stage("web")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	removed, err := s.RemoveLeftovers()
	if err != nil || len(removed) != 1 || removed[0] != left {
		t.Errorf("RemoveLeftovers = %v, %v; want [%s]", removed, err, left)
	}
	if _, err := os.Stat(held); err != nil {
		t.Errorf("a held staging folder was removed: %v", err)
	}
	if _, err := s.Get("web", "1.0.0"); err != nil {
		t.Errorf("the release went with the leftovers: %v", err)
	}
}
