package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// NoteSources opens every Go source file and go.mod/go.sum of the module
// once per test binary run. Go's test cache records the files a test opens
// and reruns the test when one of them changes, so even an edit that leaves
// the compiled code identical (a comment) reruns the tests that call it
// (every test that starts an agent). The opens must happen while a test
// runs: the cache does not log what TestMain opens before m.Run.
var NoteSources = sync.OnceFunc(func() {
	root := RepoRoot()
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil
		case d.IsDir() && p != root && strings.HasPrefix(d.Name(), "."):
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case strings.HasSuffix(p, ".go") || d.Name() == "go.mod" || d.Name() == "go.sum":
			if f, err := os.Open(p); err == nil {
				f.Close()
			}
		}
		return nil
	})
})
