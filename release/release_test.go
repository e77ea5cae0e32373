package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func tarGz(t testing.TB, hs []*tar.Header, bodies map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range hs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(bodies[h.Name]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(bodies[h.Name]))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func TestExtractRefusesEscapes(t *testing.T) {
	reg := func(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644} }
	for _, tc := range []struct {
		name string
		hs   []*tar.Header
		want string
	}{
		{"absolute", []*tar.Header{reg("/tmp/x")}, "absolute"},
		{"dotdot", []*tar.Header{reg("a/../../x")}, `".."`},
		{"symlink out", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../x"}}, "outside"},
		{"symlink absolute", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, "outside"},
		{"write through link", []*tar.Header{
			{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "sub"}, {Name: "sub", Typeflag: tar.TypeDir, Mode: 0o755}, reg("d/x")}, "link"},
		{"hard link out", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}}, "outside the release"},
		{"hard link to symlink", []*tar.Header{
			{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: "../ok"}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "a/l"}}, "not a regular file"},
		{"link chain resolving outside", []*tar.Header{
			{Name: "a/b/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "a/b/l1", Typeflag: tar.TypeSymlink, Linkname: "../.."},
			{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: "a/b/l1/../../../victim"}}, "outside"},
		{"shallow link climbed", []*tar.Header{
			{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "."},
			{Name: "x", Typeflag: tar.TypeSymlink, Linkname: "d/d/d/../../.."}}, "outside"},
		{"climb through a future link", []*tar.Header{
			{Name: "x", Typeflag: tar.TypeSymlink, Linkname: "d/d/../.."},
			{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "."}}, "outside"},
		{"reserved name", []*tar.Header{reg(".deployd-release.json")}, "reserved"},
		{"device", []*tar.Header{{Name: "c", Typeflag: tar.TypeChar}}, "device"},
		{"fifo", []*tar.Header{{Name: "f", Typeflag: tar.TypeFifo}}, "FIFO"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := t.TempDir()
			err := Extract(bytes.NewReader(tarGz(t, tc.hs, nil)), dst)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Extract: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestExtractKeepsModesAndLinks(t *testing.T) {
	dst := t.TempDir()
	data := tarGz(t, []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/server", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "current", Typeflag: tar.TypeSymlink, Linkname: "bin/server"},
		{Name: "copy", Typeflag: tar.TypeLink, Linkname: "bin/server"},
	}, map[string]string{"bin/server": "#!/bin/sh\n"})
	if err := Extract(bytes.NewReader(data), dst); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "bin/server"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("bin/server: %v %v", fi, err)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "current")); l != "bin/server" {
		t.Errorf("symlink target %q", l)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "copy")); string(b) != "#!/bin/sh\n" {
		t.Errorf("hard link content %q", b)
	}
}

func TestInstallIdempotentAndPrune(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	art := filepath.Join(t.TempDir(), "server")
	os.WriteFile(art, []byte("#!/bin/sh\necho 1\n"), 0o755)
	r1, err := s.Install("web", art, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.Version) != 12 || !strings.HasPrefix(r1.SHA256, r1.Version) {
		t.Errorf("default version %q of sha %q", r1.Version, r1.SHA256)
	}
	if again, err := s.Install("web", art, "", r1.SHA256); err != nil || again.Version != r1.Version {
		t.Fatalf("reinstall of the same content: %v %v", again, err)
	}
	os.WriteFile(art, []byte("#!/bin/sh\necho 2\n"), 0o755)
	if _, err := s.Install("web", art, r1.Version, ""); !errors.Is(err, ErrBadArtifact) {
		t.Fatalf("other content under the same version: %v", err)
	}
	for _, v := range []string{"a", "b", "c", "d"} {
		os.WriteFile(art, []byte("#!/bin/sh\necho "+v+"\n"), 0o755)
		if _, err := s.Install("web", art, v, ""); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.Prune("web", 2, r1.Version)
	if err != nil {
		t.Fatal(err)
	}
	rs, _ := s.List("web")
	if len(rs) != 3 || len(removed) != 2 {
		t.Fatalf("after prune: %d releases, removed %v", len(rs), removed)
	}
	if _, err := s.Get("web", r1.Version); err != nil {
		t.Errorf("a protected release was pruned: %v", err)
	}
	// The two newest (d, c) are kept with the protected oldest; a and b go.
	var left []string
	for _, r := range rs {
		left = append(left, r.Version)
	}
	slices.Sort(left)
	slices.Sort(removed)
	want := []string{"c", "d", r1.Version}
	slices.Sort(want)
	if !slices.Equal(left, want) || !slices.Equal(removed, []string{"a", "b"}) {
		t.Errorf("after prune: kept %v, removed %v; want kept %v, removed [a b]", left, removed, want)
	}
	if tmps, _ := filepath.Glob(filepath.Join(s.Dir, "web", tmpPrefix+"*")); len(tmps) != 0 {
		t.Errorf("leftover temp folders: %v", tmps)
	}
}

func TestInstallFailureLeavesNothing(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	bad := filepath.Join(t.TempDir(), "bad.tar.gz")
	os.WriteFile(bad, tarGz(t, []*tar.Header{{Name: "/x", Typeflag: tar.TypeReg}}, nil), 0o644)
	if _, err := s.Install("web", bad, "1", ""); !errors.Is(err, ErrBadArtifact) {
		t.Fatalf("bad tarball: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Dir, "web"))
	if len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// FuzzExtract: whatever the archive, nothing is written outside dst (a
// folder four levels deep in the test's own temp folder, so escapes of up
// to four levels land where the test sees them), no link inside dst points
// outside it (dangling or not, through other links or not), and when
// Extract succeeds, dst holds what the archive lists.
func FuzzExtract(f *testing.F) {
	f.Add(tarGz(f, []*tar.Header{{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644}}, map[string]string{"a": "x"}))
	f.Add(tarGz(f, []*tar.Header{{Name: "../a", Typeflag: tar.TypeReg}}, nil))
	f.Add(tarGz(f, []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "l/x", Typeflag: tar.TypeReg}}, nil))
	f.Add(tarGz(f, []*tar.Header{{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d"}}, nil))
	f.Add(tarGz(f, []*tar.Header{{Name: "x", Typeflag: tar.TypeSymlink, Linkname: "gone/../../../y"}}, nil))
	f.Add(tarGz(f, []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "bin/s", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "cur", Typeflag: tar.TypeSymlink, Linkname: "bin/s"},
		{Name: "h", Typeflag: tar.TypeLink, Linkname: "bin/s"},
	}, map[string]string{"bin/s": "#!/bin/sh\n"}))
	f.Add(tarGz(f, []*tar.Header{{Name: "w", Typeflag: tar.TypeReg, Mode: 0o777}, {Name: "z", Typeflag: tar.TypeReg}}, nil))
	f.Add([]byte("not a tarball"))
	f.Fuzz(func(t *testing.T, data []byte) {
		root := t.TempDir()
		parents := []string{root, filepath.Join(root, "a"), filepath.Join(root, "a", "b"), filepath.Join(root, "a", "b", "c")}
		dst := filepath.Join(parents[3], "release")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		err := Extract(bytes.NewReader(data), dst)
		filepath.WalkDir(root, func(p string, d fs.DirEntry, werr error) error {
			if werr != nil {
				return nil
			}
			if !within(p, dst) && !slices.Contains(parents, p) {
				t.Errorf("Extract wrote outside the release folder: %s", p)
			}
			if d.Type()&fs.ModeSymlink != 0 && within(p, dst) {
				if target, ok := resolveIn(dst, p); !ok {
					t.Errorf("link %s points outside the release (to %s)", p, target)
				}
			}
			return nil
		})
		if err == nil {
			checkExtracted(t, data, dst)
		}
	})
}

// umask is the process's file mode creation mask.
var umask = func() fs.FileMode {
	u := syscall.Umask(0o022)
	syscall.Umask(u)
	return fs.FileMode(u)
}()

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// resolveIn resolves link p as the kernel would, following the links it
// meets, and reports whether every step stays within dir. A component that
// does not exist ends the walk lexically (the rest of the path is joined and
// cleaned): a dangling link must not point outside either.
func resolveIn(dir, p string) (string, bool) {
	cur, rest := filepath.Dir(p), []string{filepath.Base(p)}
	for hops := 0; len(rest) > 0; {
		next := filepath.Join(cur, rest[0])
		rest = rest[1:]
		if !within(next, dir) {
			return next, false
		}
		fi, err := os.Lstat(next)
		switch {
		case err != nil:
			end := filepath.Join(append([]string{next}, rest...)...)
			return end, within(end, dir)
		case fi.Mode()&fs.ModeSymlink == 0:
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return next, true // a loop: the kernel gives ELOOP
		}
		l, _ := os.Readlink(next)
		if filepath.IsAbs(l) {
			return l, within(filepath.Clean(l), dir)
		}
		rest = append(strings.Split(l, "/"), rest...)
	}
	return cur, within(cur, dir)
}

// checkExtracted is the reference for a successful Extract: every name the
// archive lists once is in dst as that kind of entry, a file with its
// content and permission bits, a symlink with its target.
func checkExtracted(t *testing.T, data []byte, dst string) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("Extract accepted what is not gzip: %v", err)
	}
	tr := tar.NewReader(gz)
	type entry struct {
		h    *tar.Header
		body []byte
	}
	entries, count := map[string]entry{}, map[string]int{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Extract accepted an archive that does not read to its end: %v", err)
		}
		body, _ := io.ReadAll(tr)
		name := path.Clean(strings.TrimSuffix(h.Name, "/"))
		count[name]++
		entries[name] = entry{h, body}
	}
	for name, e := range entries {
		if count[name] > 1 || name == "." {
			continue
		}
		p := filepath.Join(dst, name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("archive entry %q (type %q) is not in the release: %v", e.h.Name, e.h.Typeflag, err)
			continue
		}
		switch e.h.Typeflag {
		case tar.TypeReg:
			// Extract adds owner read and the process umask applies.
			want := (fs.FileMode(e.h.Mode)&0o777 | 0o400) &^ umask
			if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, e.body) || fi.Mode().Perm() != want {
				t.Errorf("file %q: content %q mode %v (%v), want %q mode %v", name, b, fi.Mode(), err, e.body, want)
			}
		case tar.TypeDir:
			if !fi.IsDir() {
				t.Errorf("folder %q is a %v", name, fi.Mode())
			}
		case tar.TypeSymlink:
			if l, err := os.Readlink(p); err != nil || l != e.h.Linkname {
				t.Errorf("symlink %q -> %q (%v), archive has -> %q", name, l, err, e.h.Linkname)
			}
		case tar.TypeLink:
			if !fi.Mode().IsRegular() {
				t.Errorf("hard link %q is a %v", name, fi.Mode())
			}
		}
	}
}
