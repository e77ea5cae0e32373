package dashboard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRedirectPagePrivate(t *testing.T) {
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	for runtime, wantIn := range map[string]string{private: private, shared: os.TempDir(), "relative": os.TempDir()} {
		t.Setenv("XDG_RUNTIME_DIR", runtime)
		url := `http://127.0.0.1:1/TOKEN/?a=1&b="<x>"`
		path, remove, err := RedirectPage(url)
		if err != nil {
			t.Fatal(err)
		}
		if got := filepath.Dir(filepath.Dir(path)); got != wantIn {
			t.Errorf("XDG_RUNTIME_DIR=%s: page in %s, want in %s", runtime, got, wantIn)
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode() != 0o600 {
			t.Errorf("page %s: %v %v, want mode 0600", path, fi.Mode(), err)
		}
		if fi, err := os.Lstat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("page's folder: %v %v, want mode 0700", fi.Mode(), err)
		}
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), `"<x>"`) || !strings.Contains(string(b), `&amp;b=&#34;&lt;x&gt;&#34;`) {
			t.Errorf("the URL is not escaped in the page:\n%s", b)
		}
		remove()
		remove() // twice is fine
		if _, err := os.Lstat(filepath.Dir(path)); !os.IsNotExist(err) {
			t.Errorf("after remove: %v, want the folder gone", err)
		}
	}
}
