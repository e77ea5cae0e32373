package goinstall

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const modPath = "github.com/deployd/deployd"

// TestGoInstallFromModuleProxy publishes the work tree as v0.9.9 on a
// file-system GOPROXY and runs `go install .../cmd/deployd@latest` into a
// temporary GOBIN, then the installed binary's --version. Dependencies come
// from this machine's module cache (its cache/download folder is a GOPROXY
// tree), so the test needs no network. A second version whose go.mod has a
// replace directive must be refused, as `go install` refuses any: that is
// what a fork under `replace` cost.
func TestGoInstallFromModuleProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds deployd from a module zip")
	}
	root := repoRoot()
	files := workTreeFiles(t, root)
	gomod := readFile(t, filepath.Join(root, "go.mod"))
	if bytes.Contains(gomod, []byte("\nreplace ")) {
		t.Errorf("go.mod has a replace directive: go install @version refuses it")
	}

	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	publish(t, proxy, "v0.9.9", root, files, gomod)
	replaced := append(append([]byte{}, gomod...), "\nreplace github.com/urfave/cli/v2 => ./third_party/urfave-cli-v2\n"...)
	publish(t, proxy, "v0.9.10-replaced", root, files, replaced)

	cache := goEnv(t, "GOMODCACHE")
	gobin := filepath.Join(tmp, "bin")
	env := append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download")),
		"GOMODCACHE="+filepath.Join(tmp, "modcache"), // a fresh one: the published versions stay out of the real cache
		"GONOSUMDB="+modPath, "GOSUMDB=off", "GOFLAGS=-mod=mod",
		"GOBIN="+gobin, "CGO_ENABLED=0", "GOWORK=off",
	)
	goCmd := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = tmp // outside any module
		cmd.Env = env
		cmd.WaitDelay = 10 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// @latest picks v0.9.9: a pre-release never beats a release.
	if out, err := goCmd(ctx, "install", modPath+"/cmd/deployd@latest"); err != nil {
		t.Fatalf("go install @latest: %v\n%s", err, out)
	}
	vctx, vcancel := context.WithTimeout(ctx, 30*time.Second)
	defer vcancel()
	out, err := exec.CommandContext(vctx, filepath.Join(gobin, "deployd"), "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v0.9.9") {
		t.Errorf("installed deployd --version: %v, %q; want it to name v0.9.9", err, out)
	}

	out2, err := goCmd(ctx, "install", modPath+"/cmd/deployd@v0.9.10-replaced")
	if err == nil || !strings.Contains(out2, "replace directives") {
		t.Errorf("go install of a version with a replace: %v, want it refused for its replace directives\n%s", err, out2)
	}
}

// publish lays out version as a GOPROXY serves it: @v/list, .info, .mod, .zip.
func publish(t *testing.T, proxy, version, root string, files []string, gomod []byte) {
	t.Helper()
	dir := filepath.Join(proxy, filepath.FromSlash(modPath), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mv := module.Version{Path: modPath, Version: version}
	var zfiles []modzip.File
	for _, f := range files {
		if f == "go.mod" {
			zfiles = append(zfiles, memFile{"go.mod", gomod})
			continue
		}
		zfiles = append(zfiles, diskFile{f, filepath.Join(root, filepath.FromSlash(f))})
	}
	zf, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	if err := modzip.Create(zf, mv, zfiles); err != nil {
		t.Fatalf("module zip %s: %v", version, err)
	}
	if err := zf.Close(); err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]string{"Version": version, "Time": "2026-12-01T00:00:00Z"})
	write(t, filepath.Join(dir, version+".info"), info)
	write(t, filepath.Join(dir, version+".mod"), gomod)
	list, _ := os.ReadFile(filepath.Join(dir, "list"))
	write(t, filepath.Join(dir, "list"), append(list, version+"\n"...))
}

// workTreeFiles lists the files a commit of the work tree would hold: the
// tracked ones and the untracked ones git does not ignore (the module zip of
// a tag holds the tracked ones).
func workTreeFiles(t *testing.T, root string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files (the test publishes the files git would): %v", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, f)); err != nil { // deleted, not yet committed
			continue
		}
		files = append(files, f)
	}
	return files
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

type diskFile struct{ name, path string }

func (f diskFile) Path() string                 { return f.name }
func (f diskFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.path) }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }

type memFile struct {
	name string
	data []byte
}

func (f memFile) Path() string                 { return f.name }
func (f memFile) Lstat() (os.FileInfo, error)  { return memInfo{f}, nil }
func (f memFile) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(f.data)), nil }

type memInfo struct{ f memFile }

func (i memInfo) Name() string       { return filepath.Base(i.f.name) }
func (i memInfo) Size() int64        { return int64(len(i.f.data)) }
func (i memInfo) Mode() os.FileMode  { return 0o644 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }
