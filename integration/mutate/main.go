// Command mutate checks that the test suite catches deliberate breakages: it
// copies the module to a temporary folder, applies each mutation of the
// table below to the copy (a search/replace of a small code snippet), runs
// the tests meant to catch it, and prints which of them failed. A mutation
// no test catches, a snippet that is not found exactly once (the code moved:
// update the table), a mutation that does not compile, or a targeted test
// that fails without any mutation, makes it exit 1.
//
//	go run ./integration/mutate            # all mutations
//	go run ./integration/mutate -only drain # the ones whose name contains "drain"
//	go run ./integration/mutate -check      # every snippet applies and builds; no test runs (CI)
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"
)

// target is one `go test -count=1 -run Run Pkg`.
type target struct{ Pkg, Run string }

// mutation replaces Old by New in File (exactly one occurrence).
type mutation struct {
	Name     string
	File     string
	Old, New string
	Tests    []target
}

// mutations is the table. Keep the snippets small and stable; when the code
// they match moves, the tool says so and the snippet is updated here.
var mutations = []mutation{
	{
		Name: "config check says ok",
		File: "cli/agent.go",
		Old: `				cfg, err := config.Load(path)
				if err != nil {
					return fail(ExitUsage, "%v", err)
				}`,
		New: `				cfg, err := config.Load(path)
				if err != nil {
					fmt.Fprintf(c.App.Writer, "%s: ok\n", path)
					return nil
				}`,
		Tests: []target{{"./cli", "TestMainExitCodes"}, {"./integration", "^TestConfigCheck$"}},
	},
	{
		Name:  "reload skips readiness",
		File:  "workers/reload.go",
		Old:   `if err = o.s.waitReady(w, time.Until(deadline), spec); err != nil {`,
		New:   `if err = error(nil); err != nil && deadline.IsZero() {`,
		Tests: []target{{"./workers", "Reload"}, {"./integration", "^TestReload(AbandonedWhenNeverReady|WithSlowStartingVersion|sUnderLoadDropNothing)$"}},
	},
	{
		Name: "a crash is not restarted",
		File: "workers/crash.go",
		Old: `func (s *Supervisor) onExit(st *state, sl *slot, w *Worker) {
	if st.closing`,
		New: `func (s *Supervisor) onExit(st *state, sl *slot, w *Worker) {
	if sl != nil {
		return
	}
	if st.closing`,
		Tests: []target{{"./workers", "Crash|Restart"}, {"./integration", "^TestCrashedWorkerIsReplacedInItsSlot$"}},
	},
	{
		Name: "a log line is dropped",
		File: "workers/logs/capture.go",
		Old: `		fn(string(text))
		p, offset = p[n:], offset+n`,
		New: `		if !bytes.HasSuffix(text, []byte("000")) {
			fn(string(text))
		}
		p, offset = p[n:], offset+n`,
		Tests: []target{{"./workers/logs", "."}, {"./integration", "^TestLogsEveryLineOnceAcrossRotations$"}},
	},
	{
		Name: "the drain closes connections early",
		File: "worker/drain.go",
		Old:  `	s.wg.Wait() // no Accept runs any more`,
		New: `	s.wg.Wait() // no Accept runs any more
	if len(ls) >= 0 {
		return s.HTTP.Close()
	}`,
		Tests: []target{{"./worker", "Drain"}, {"./integration/testapp", "^TestListenServesAndDrainsOnSIGTERM$"}, {"./integration", "^TestReloadsUnderLoadDropNothing$"}},
	},
	{
		Name:  "the Node.js drain closes idle connections at once",
		File:  "workers/nodejs/preload.cjs",
		Old:   `return Math.max(st.lastCall, c.idleSince + IDLE_GRACE_MS);`,
		New:   `return 0;`,
		Tests: []target{{"./workers/nodejs", "Drain"}, {"./integration", "^TestNode(TutorialAppExpress4|ServerCloseHandlerExpress5)$"}},
	},
	{
		Name:  "the Node.js drain skips fd listeners",
		File:  "workers/nodejs/preload.cjs",
		Old:   `srv.prependOnceListener('listening', function () { adopt(srv); });`,
		New:   `srv.prependOnceListener('listening', function () {});`,
		Tests: []target{{"./workers/nodejs", "FdListen"}, {"./integration", "^TestNodeFdListen$"}},
	},
	{
		Name: "the Node.js drain closes a connection with an unread request",
		File: "workers/nodejs/preload.cjs",
		Old: `  function closeIfQuiet(st, sock, c, destroy) {
    if (c.checking || sock.destroyed) return;`,
		New: `  function closeIfQuiet(st, sock, c, destroy) {
    if (!sock.destroyed) return destroy ? sock.destroy() : sock.end();
    if (c.checking || sock.destroyed) return;`,
		Tests: []target{{"./workers/nodejs", "BusyLoop"}, {"./integration", "^TestNodeCPUBoundRoute$"}},
	},
	{
		Name:  "the notify parser returns nothing",
		File:  "handoff/notify.go",
		Old:   `		n[string(k)] = string(v)`,
		New:   `		_, _ = k, v`,
		Tests: []target{{"./handoff", "Notify"}, {"./integration", "^TestReadinessModes$"}},
	},
	{
		Name: "a blue-green worker takes its position as it gets ready",
		File: "workers/steer.go",
		Old: `	for sl, p := range st.pos {
		w := sl.cur`,
		New: `	for sl, p := range st.pos {
		for _, x := range sl.extra {
			if x.isReady() && x.hasMembers() {
				s.steerIn(p, x)
			}
		}
		w := sl.cur`,
		Tests: []target{{"./workers", "TestBlueGreen"}, {"./integration", "^TestBlueGreen(CutoverOnSteeredPools|NeverReadyKeepsV1Alone)$"}},
	},
}

func main() {
	only := flag.String("only", "", "run only the mutations whose name contains this")
	baseline := flag.Bool("baseline", true, "first check that every targeted test passes without mutation")
	keep := flag.Bool("keep", false, "keep the temporary copy")
	check := flag.Bool("check", false, "only check that every mutation applies and builds (no test runs)")
	flag.Parse()
	if err := run(*only, *baseline, *keep, *check); err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(1)
	}
}

func run(only string, baseline, keep, check bool) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	var todo []mutation
	for _, m := range mutations {
		if strings.Contains(m.Name, only) {
			todo = append(todo, m)
		}
	}
	if len(todo) == 0 {
		return fmt.Errorf("no mutation matches -only %q", only)
	}
	// Every snippet is checked before anything runs, so a stale table fails at once.
	var stale []error
	for _, m := range todo {
		if _, err := apply(root, m); err != nil {
			stale = append(stale, err)
		}
	}
	if err := errors.Join(stale...); err != nil {
		return fmt.Errorf("update the mutation table in integration/mutate/main.go:\n%w", err)
	}
	tmp, err := os.MkdirTemp("", "deployd-mutate-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("copy kept in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if err := copyTree(root, tmp); err != nil {
		return fmt.Errorf("copy the module: %w", err)
	}
	// Every mutation must build before any test runs.
	for _, m := range todo {
		if err := withMutation(tmp, m, func() error { return nil }); err != nil {
			return err
		}
	}
	if check {
		fmt.Printf("all %d mutations apply and build\n", len(todo))
		return nil
	}
	if baseline {
		if err := checkBaseline(tmp, todo); err != nil {
			return err
		}
	}
	rows, missed := make([][]string, 0, len(todo)), 0
	for _, m := range todo {
		row, caught, err := try(tmp, m)
		if err != nil {
			return err
		}
		if !caught {
			missed++
		}
		rows = append(rows, row)
	}
	printTable(rows)
	if missed > 0 {
		return fmt.Errorf("%d of %d mutations were not caught by their tests", missed, len(todo))
	}
	fmt.Printf("all %d mutations caught\n", len(todo))
	return nil
}

// apply returns the file's content with m applied, or an error if the
// snippet is not found exactly once.
func apply(root string, m mutation) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(root, m.File))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name, err)
	}
	if n := bytes.Count(b, []byte(m.Old)); n != 1 {
		return nil, fmt.Errorf("%s: the snippet is found %d times in %s, want exactly once:\n%s", m.Name, n, m.File, m.Old)
	}
	return bytes.Replace(b, []byte(m.Old), []byte(m.New), 1), nil
}

// checkBaseline runs every targeted test once on the unmutated copy.
func checkBaseline(dir string, ms []mutation) error {
	seen := map[target]bool{}
	for _, m := range ms {
		for _, tg := range m.Tests {
			if seen[tg] {
				continue
			}
			seen[tg] = true
			t0 := time.Now()
			res := goTest(dir, tg)
			fmt.Printf("baseline %s -run %q: %s (%s)\n", tg.Pkg, tg.Run, res.verdict(), time.Since(t0).Round(time.Second))
			if res.failed || res.noTests {
				return fmt.Errorf("baseline: %s -run %q must pass (and run tests) without mutation:\n%s", tg.Pkg, tg.Run, res.out)
			}
		}
	}
	return nil
}

// withMutation applies m to the copy in dir, checks that it builds, runs fn
// and restores the file.
func withMutation(dir string, m mutation, fn func() error) error {
	path := filepath.Join(dir, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	mutated, err := apply(dir, m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, mutated, 0o644); err != nil {
		return err
	}
	defer os.WriteFile(path, orig, 0o644)
	build := exec.Command("go", "build", "./"+filepath.Dir(m.File))
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: the mutated code does not build (fix the table):\n%s", m.Name, out)
	}
	if ext := filepath.Ext(m.File); ext == ".js" || ext == ".cjs" || ext == ".mjs" {
		syntax := exec.Command("node", "--check", path)
		if out, err := syntax.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: the mutated script is not valid JavaScript (fix the table):\n%s", m.Name, out)
		}
	}
	return fn()
}

// try runs m's tests with m applied and returns its table row.
func try(dir string, m mutation) (row []string, caught bool, err error) {
	var failing []string
	err = withMutation(dir, m, func() error {
		for _, tg := range m.Tests {
			t0 := time.Now()
			res := goTest(dir, tg)
			fmt.Printf("%s: %s -run %q: %s (%s)\n", m.Name, tg.Pkg, tg.Run, res.verdict(), time.Since(t0).Round(time.Second))
			if res.failed {
				caught = true
				failing = append(failing, tg.Pkg+": "+strings.Join(res.failing, ","))
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	verdict := "CAUGHT"
	if !caught {
		verdict, failing = "MISSED", []string{"(none)"}
	}
	return []string{m.Name, m.File, verdict, strings.Join(failing, "; ")}, caught, nil
}

type testResult struct {
	failed, noTests bool
	failing         []string
	out             string
}

func (r testResult) verdict() string {
	switch {
	case r.failed && len(r.failing) > 0:
		return "FAIL " + strings.Join(r.failing, ",")
	case r.failed:
		return "FAIL"
	case r.noTests:
		return "ok, but no test matched"
	}
	return "ok"
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

func goTest(dir string, tg target) testResult {
	cmd := exec.Command("go", "test", "-count=1", "-timeout", "10m", "-run", tg.Run, tg.Pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CI=") // a skip is not a failure here: only the mutation decides
	out, err := cmd.CombinedOutput()
	r := testResult{failed: err != nil, out: string(out), noTests: bytes.Contains(out, []byte("[no tests to run]"))}
	for _, m := range failLine.FindAllStringSubmatch(string(out), -1) {
		if !strings.Contains(m[1], "/") { // top-level tests only
			r.failing = append(r.failing, m[1])
		}
	}
	return r
}

func printTable(rows [][]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nMUTATION\tFILE\tRESULT\tFAILING TESTS")
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run it inside the deployd module")
	}
	return filepath.Dir(gomod), nil
}

// copyTree copies the module's files (not .git) from src into dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		case !d.Type().IsRegular():
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
