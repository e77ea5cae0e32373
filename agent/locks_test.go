package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// fileOwners may write a file on disk while they hold their lock: the lock
// orders the writes. They call no method of this package that locks, and
// no callback other than a pure edit of a copy.
var fileOwners = map[string]string{
	"stateFile.update":       "fn edits a copy of the app's state; writeLocked writes state.json",
	"recordBook.write":       "put writes this agent's record (record.go)",
	"recordBook.markReady":   "put writes this agent's record",
	"recordBook.beforeStart": "put writes this agent's record",
}

// leafCalls are what code may call while it holds a lock: builtins, and
// the lock's own methods.
var leafCalls = map[string]bool{
	"append": true, "len": true, "cap": true, "make": true, "delete": true, "copy": true, "clear": true,
	"min": true, "max": true, "new": true, "close": true,
	"Lock": true, "Unlock": true, "TryLock": true,
}

// Every lock of the package is taken in leaf code: from its Lock to its
// Unlock (or the end of the function, after a deferred Unlock) the code
// calls nothing but builtins. A method that holds a lock cannot call one
// that takes it, so a re-entrant Lock (a deadlock no test of one method
// sees) cannot be written. Operation locks (busy, upgrades.running) are TryLock
// only and are held across an operation on purpose, as learner.deciding is
// across one decision on an address (over leaf parts only): they are not
// checked.
func TestLocksAreTakenInLeavesOnly(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			fn := funcName(fd)
			if _, ok := fileOwners[fn]; ok {
				continue
			}
			for _, c := range callsUnderLock(fd.Body) {
				bad = append(bad, fset.Position(c.Pos()).String()+": "+fn+" holds a lock and calls "+callName(c))
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b + "; take a lock only in a leaf method that calls nothing (copy under the lock, call after Unlock)")
	}
}

// callsUnderLock returns the calls other than leafCalls made while a lock
// named mu is held, in body and in every function literal inside it.
func callsUnderLock(body *ast.BlockStmt) []*ast.CallExpr {
	var out []*ast.CallExpr
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BlockStmt:
			out = append(out, scanBlock(n.List)...)
		case *ast.CaseClause:
			out = append(out, scanBlock(n.Body)...)
		case *ast.CommClause:
			out = append(out, scanBlock(n.Body)...)
		}
		return true
	})
	return out
}

// scanBlock walks the statements of one block in order: a statement that
// locks a mu holds it until one that unlocks it (a deferred Unlock holds it
// to the end of the block).
func scanBlock(stmts []ast.Stmt) []*ast.CallExpr {
	var out []*ast.CallExpr
	held := false
	for _, s := range stmts {
		if held {
			ast.Inspect(s, func(n ast.Node) bool {
				if _, lit := n.(*ast.FuncLit); lit {
					return false // runs later, or is checked on its own
				}
				if c, ok := n.(*ast.CallExpr); ok && !leafCalls[callName(c)] && !isConversion(c) {
					out = append(out, c)
				}
				return true
			})
		}
		switch muCall(s) {
		case "Lock":
			held = true
		case "Unlock":
			held = false
		}
	}
	return out
}

// muCall is "Lock" for `X.mu.Lock()` and "Unlock" for `X.mu.Unlock()` as a
// statement of its own ("" for a deferred Unlock and anything else).
func muCall(s ast.Stmt) string {
	es, ok := s.(*ast.ExprStmt)
	if !ok {
		return ""
	}
	c, ok := es.X.(*ast.CallExpr)
	if !ok {
		return ""
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	if recv, ok := sel.X.(*ast.SelectorExpr); ok && recv.Sel.Name == "mu" {
		return sel.Sel.Name
	}
	if id, ok := sel.X.(*ast.Ident); ok && id.Name == "mu" {
		return sel.Sel.Name
	}
	return ""
}

func callName(c *ast.CallExpr) string {
	switch f := c.Fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return "a function value"
}

// isConversion: []string(nil), string(b) and the like.
func isConversion(c *ast.CallExpr) bool {
	switch f := c.Fun.(type) {
	case *ast.ArrayType, *ast.MapType:
		return true
	case *ast.Ident:
		switch f.Name {
		case "string", "int", "int64", "uint64", "float64", "byte", "rune":
			return true
		}
	}
	return false
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// The checker above reads every file of the package, so each part's lock
// is checked where it is taken: this names the parts that own a lock and
// fails when one of them no longer takes it in a leaf the checker sees
// (renamed away from mu, or moved out of the package).
func TestLockCheckerCoversTheParts(t *testing.T) {
	owners := []string{"appSet", "appRT", "generations", "stateFile", "afterHooks", "recordBook", "builder"}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	locks := map[string]int{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			typ, _, _ := strings.Cut(funcName(fd), ".")
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if s, ok := n.(ast.Stmt); ok && muCall(s) == "Lock" {
					locks[typ]++
				}
				return true
			})
		}
	}
	for _, o := range owners {
		if locks[o] == 0 {
			t.Errorf("%s takes no mu lock the checker sees", o)
		}
	}
}
