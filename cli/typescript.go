package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// `deployd start FILE.ts` as PM2 7 users expect it: the project's own tsx
// or ts-node (its node_modules/.bin), else Node.js's own type stripping
// where the installed node has it by default (22.18 and later).

func isTypeScript(file string) bool {
	switch filepath.Ext(file) {
	case ".ts", ".mts", ".cts":
		return true
	}
	return false
}

// tsRunners are the TypeScript runners looked for in node_modules/.bin,
// best first: tsx runs any TypeScript without a tsconfig; ts-node needs
// one that matches the code (and breaks with typescript 7).
var tsRunners = []string{"tsx", "ts-node"}

// typeScriptRunner is the command that runs the TypeScript file (the file
// goes after it): node with the tsx loader where wd or a folder above it
// has tsx installed; else the first of tsRunners in a node_modules/.bin of
// the file's folder or above it, then of wd or above; else the node on
// PATH, by its path, where it strips types by default. The error says how
// to get one.
func typeScriptRunner(file, wd string) ([]string, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, fail(ExitFailed, "%v", err)
	}
	// tsx as node's own loader, so that node is the worker itself: the tsx
	// command runs node as its child, relays the stop signal, and SIGKILLs
	// the child when it has not heard back within 60 ms, which a busy host
	// misses while the child drains. node resolves --import from its cwd,
	// which is wd.
	if findUp(wd, filepath.Join("node_modules", "tsx", "package.json")) != "" {
		return []string{"node", "--import", "tsx"}, nil
	}
	for _, from := range []string{filepath.Dir(abs), wd} {
		for _, name := range tsRunners {
			if p := findUp(from, filepath.Join("node_modules", ".bin", name)); p != "" {
				return []string{p}, nil
			}
		}
	}
	// The node whose version was checked, by its path: the agent looks
	// "node" up in its own PATH, where an older node may come first.
	if node, err := exec.LookPath("node"); err == nil && nodeStripsTypes(node) {
		if abs, err := filepath.Abs(node); err == nil {
			node = abs
		}
		return []string{node}, nil
	}
	return nil, fail(ExitUsage, "%s is TypeScript, and no runner for it was found: install tsx in the project (npm install --save-dev tsx), "+
		"or use Node.js 22.18 or later (it runs .ts itself), or name one with --interpreter (bun, ./node_modules/.bin/ts-node)", file)
}

// runnerStartup is the ready_timeout a worker run by runner needs, and
// why, or "" when the default does: ts-node type-checks the whole project
// before the app's first line runs, which takes tens of seconds on a busy
// host (past the default 30 s in which a new app must listen); tsx
// compiles each file as node loads it, which took 20–23 s on a 2-core host
// at load average 40 (close to the default, which it then passed at times).
func runnerStartup(runner []string) (timeout, why string) {
	if strings.HasPrefix(filepath.Base(runner[0]), "ts-node") {
		return "2m", "ts-node type-checks the project at each start (tsx does not)"
	}
	if filepath.Base(runner[0]) == "tsx" || slices.Contains(runner, "tsx") {
		return "1m", "tsx compiles each file as node loads it, at each start"
	}
	return "", ""
}

// findUp returns the first dir/rel that is an executable file (or a .json
// file), for dir and each folder above it, or "".
func findUp(dir, rel string) string {
	for {
		p := filepath.Join(dir, rel)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && (fi.Mode()&0o111 != 0 || filepath.Ext(p) == ".json") {
			return p
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// nodeStripsTypes tells whether the node at path runs .ts files without a
// flag (stripsTypes of its --version).
func nodeStripsTypes(node string) bool {
	out, err := exec.Command(node, "--version").Output()
	return err == nil && stripsTypes(string(out))
}

// stripsTypes tells whether node of version v ("v22.18.0") strips types by
// default: from Node.js 22.18 and 23.6.
func stripsTypes(v string) bool {
	parts := strings.SplitN(strings.TrimPrefix(strings.TrimSpace(v), "v"), ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 23 || major == 23 && minor >= 6 || major == 22 && minor >= 18
}
