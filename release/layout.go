package release

import (
	"os"
	"path/filepath"
	"strings"
)

// scriptExts are the extensions of a script an interpreter's command
// names (node server.js, python3 app.py): an argument with one is a file
// of the release.
var scriptExts = map[string]bool{".js": true, ".cjs": true, ".mjs": true, ".ts": true, ".mts": true, ".cts": true,
	".py": true, ".rb": true, ".php": true, ".pl": true, ".sh": true, ".jar": true}

// Nested finds a release packed with a top-level folder (tar -czf app.tgz
// myapp-1.0): a file the command names (a relative argv[0] with a slash,
// or a script argument) that is missing from the release folder dir but
// is in dir's only entry, a folder. It returns that folder's name and the
// file, or "" when the command's files are where it says, or the layout is
// not that one.
func Nested(dir string, command []string) (top, file string) {
	for i, arg := range command {
		if !nameIsFile(i, arg) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, arg)); err == nil {
			continue
		}
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 1 || !ents[0].IsDir() {
			return "", ""
		}
		if _, err := os.Lstat(filepath.Join(dir, ents[0].Name(), arg)); err == nil {
			return ents[0].Name(), arg
		}
	}
	return "", ""
}

// nameIsFile says whether command[i] names a file of the release.
func nameIsFile(i int, arg string) bool {
	if arg == "" || filepath.IsAbs(arg) || strings.HasPrefix(arg, "-") || strings.HasPrefix(arg, "..") {
		return false
	}
	if i == 0 {
		return strings.Contains(arg, "/")
	}
	return scriptExts[filepath.Ext(arg)]
}
