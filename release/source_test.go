package release

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// folderStream writes dir as the client's tar stream (api.PackDir's
// format: walk order, "." first, PackEnd last unless cut) into a file.
func folderStream(t *testing.T, dir string, cut bool) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stream-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		link := ""
		if info.Mode()&os.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		h, _ := tar.FileInfoHeader(info, link)
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !cut {
		tw.WriteHeader(&tar.Header{Name: PackEnd, Typeflag: tar.TypeReg, Mode: 0o600})
		tw.Close()
	} else {
		tw.Flush()
	}
	f.Seek(0, 0)
	return f
}

func sampleDir(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "app")
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "run"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "bin", "data"), []byte("data"), 0o640)
	os.Symlink("bin/data", filepath.Join(dir, "link"))
	return dir
}

// A folder sent as a stream gets the digest Install gives the same folder
// by path, so --sha256 and versions mean the same either way.
func TestInstallFromFolderStreamMatchesPath(t *testing.T) {
	dir := sampleDir(t)
	byPath, err := (&Store{Dir: t.TempDir()}).Install("web", dir, "", "")
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{Dir: t.TempDir()}
	rel, err := s.InstallFrom("web", Source{File: folderStream(t, dir, false), Kind: KindDir, Name: "app"}, "", byPath.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if rel.SHA256 != byPath.SHA256 || rel.Size != byPath.Size || rel.Version != byPath.Version {
		t.Errorf("stream %s/%d/%s, path %s/%d/%s", rel.SHA256, rel.Size, rel.Version, byPath.SHA256, byPath.Size, byPath.Version)
	}
	if b, err := os.ReadFile(filepath.Join(rel.Path, "bin", "data")); err != nil || string(b) != "data" {
		t.Errorf("bin/data: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(rel.Path, "link")); err != nil || l != "bin/data" {
		t.Errorf("link: %q %v", l, err)
	}
}

// A refused stream leaves nothing under the store, not even the app's folder.
func TestInstallFromRefusalsLeaveNothing(t *testing.T) {
	dir := sampleDir(t)
	notExec := filepath.Join(t.TempDir(), "server")
	os.WriteFile(notExec, []byte("x"), 0o644)
	open := func(p string) *os.File {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name    string
		src     Source
		sha     string
		problem Problem
	}{
		{"cut stream", Source{File: folderStream(t, dir, true), Kind: KindDir, Name: "app"}, "", Unpack},
		{"checksum", Source{File: folderStream(t, dir, false), Kind: KindDir, Name: "app"}, "00", ChecksumMismatch},
		{"not executable", Source{File: open(notExec), Kind: KindFile, Name: "server"}, "", NotExecutable},
		{"bad name", Source{File: open(notExec), Kind: KindFile, Name: "../server"}, "", BadName},
		{"not a tarball", Source{File: open(notExec), Kind: KindTarball, Name: "x.tar.gz"}, "", Unpack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{Dir: filepath.Join(t.TempDir(), "releases")}
			_, err := s.InstallFrom("web", tc.src, "1", tc.sha)
			var re *RefusedError
			if !errors.As(err, &re) || re.Problem != tc.problem || !errors.Is(err, ErrBadArtifact) {
				t.Fatalf("got %v, want a %s refusal", err, tc.problem)
			}
			if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the store folder was left behind: %v", err)
			}
		})
	}
}
