package config

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Problem is one thing wrong with a config file.
type Problem struct {
	File string // the config path as given to Load/Parse
	Line int    // 1-based; 0 when unknown or not about a line
	Col  int    // 1-based column of a syntax error; 0 otherwise
	Key  string // dotted key, e.g. "apps.web.ready_timeout"; may be empty
	// Value is the offending value as TOML would write it ("\"30x\"", "-1");
	// empty when not about one value.
	Value string
	// Msg says what is wrong and how to fix it.
	Msg string
	// Err is the underlying error, if any (a toml.ParseError, a
	// *regexp/syntax.Error, an fs error...).
	Err error
}

// maxSnippet bounds what a problem quotes of the file (a line, a key, a
// value): a config may hold a line of a megabyte.
const maxSnippet = 160

// maxShown bounds the problems Error lists.
const maxShown = 50

// String formats the problem as FILE:LINE: KEY = VALUE: MSG, every line of
// it clipped to a few hundred bytes.
func (p Problem) String() string {
	lines := strings.Split(p.format(), "\n")
	for i, l := range lines {
		lines[i] = clip(l, 3*maxSnippet)
	}
	return strings.Join(lines, "\n")
}

// clip shortens s to about n bytes (on a rune boundary), saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes more)", s[:cut], len(s)-cut)
}

func (p Problem) format() string {
	if p.Line == 0 && p.Key == "" {
		return p.Msg // file-level problems name the file in Msg
	}
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	if p.Col > 0 {
		fmt.Fprintf(&b, ":%d", p.Col)
	}
	b.WriteString(": ")
	if p.Key != "" {
		b.WriteString(clip(p.Key, maxSnippet))
		if p.Value != "" {
			b.WriteString(" = " + clip(p.Value, maxSnippet))
		}
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error is every problem found in one config file. Load and Parse return
// it (as error) whenever the file is not usable.
type Error struct {
	Problems []Problem
}

// Error lists the problems, one per line, in file order; past maxShown,
// it says how many more there are.
func (e *Error) Error() string {
	lines := make([]string, 0, min(len(e.Problems), maxShown+1))
	for i, p := range e.Problems {
		if i == maxShown {
			lines = append(lines, fmt.Sprintf("... and %d more problems", len(e.Problems)-maxShown))
			break
		}
		lines = append(lines, p.String())
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the underlying errors of the problems, so errors.Is and
// errors.As see through (e.g. fs.ErrNotExist for a missing file).
func (e *Error) Unwrap() []error {
	var errs []error
	for _, p := range e.Problems {
		if p.Err != nil {
			errs = append(errs, p.Err)
		}
	}
	return errs
}

// problems collects Problems for one file; owned by one Parse call.
type problems struct {
	file  string
	lines keyLines
	list  []Problem
}

// add records a problem about key (a dotted path), locating its line.
func (ps *problems) add(key []string, value, msg string, err error) {
	ps.list = append(ps.list, Problem{
		File:  ps.file,
		Line:  ps.lines.find(key),
		Key:   keyString(key),
		Value: value,
		Msg:   msg,
		Err:   err,
	})
}

// addf is add with a formatted message and no underlying error.
func (ps *problems) addf(key []string, value, format string, args ...any) {
	ps.add(key, value, fmt.Sprintf(format, args...), nil)
}

// err returns nil or an *Error sorted by line (stable, so problems on one
// line keep their order).
func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	sort.SliceStable(ps.list, func(i, j int) bool { return ps.list[i].Line < ps.list[j].Line })
	return &Error{Problems: ps.list}
}
