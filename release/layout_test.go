package release

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNestedFindsATopLevelFolder(t *testing.T) {
	write := func(t *testing.T, dir string, files ...string) string {
		for _, f := range files {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		name      string
		files     []string
		command   []string
		top, file string
	}{
		{"script under the folder", []string{"myapp-1.0/server.js", "myapp-1.0/package.json"}, []string{"node", "server.js"}, "myapp-1.0", "server.js"},
		{"program under the folder", []string{"myapp-1.0/bin/server"}, []string{"./bin/server", "--port", "8080"}, "myapp-1.0", "./bin/server"},
		{"flat release", []string{"server.js", "package.json"}, []string{"node", "server.js"}, "", ""},
		{"command names the folder", []string{"myapp-1.0/server.js"}, []string{"node", "myapp-1.0/server.js"}, "", ""},
		{"two top-level entries", []string{"a/server.js", "b/x"}, []string{"node", "server.js"}, "", ""},
		{"file nowhere", []string{"myapp-1.0/other.js"}, []string{"node", "server.js"}, "", ""},
		{"program in PATH", []string{"myapp-1.0/server.js"}, []string{"python3", "-m", "http.server"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t, t.TempDir(), tc.files...)
			top, file := Nested(dir, tc.command)
			if top != tc.top || file != tc.file {
				t.Errorf("Nested(%v) = %q, %q; want %q, %q", tc.command, top, file, tc.top, tc.file)
			}
		})
	}
}
