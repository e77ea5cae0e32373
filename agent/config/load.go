package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/boundedfile"
)

// MaxFileSize bounds a config file: the agent reads it again on every
// reload a member of socket_group may ask for. A config of a thousand apps
// is about 200 KiB.
const MaxFileSize = 1 << 20

// DefaultPath is the config file used when neither -c nor $DEPLOYD_CONFIG
// names one.
const DefaultPath = "./deployd.toml"

// Find returns the config path to use: the -c flag value, else
// $DEPLOYD_CONFIG, else DefaultPath; as given, not made absolute.
func Find(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if env := os.Getenv("DEPLOYD_CONFIG"); env != "" {
		return env
	}
	return DefaultPath
}

// Load reads, parses and validates the config file at path. On failure the
// error is an *Error listing every problem found.
//
// The file must be a regular file (a link to one is fine) of at most
// MaxFileSize bytes: a FIFO or a device is refused without waiting or
// reading, and so is a larger file, before it is read.
func Load(path string) (*Config, error) {
	data, err := boundedfile.ReadFile(path, boundedfile.Options{Max: MaxFileSize})
	if err != nil {
		msg := fmt.Sprintf("read config file %s: %v; check the path and its permissions", path, err)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			msg = fmt.Sprintf("config file %s not found; pass -c FILE or set DEPLOYD_CONFIG", path)
		case errors.Is(err, boundedfile.ErrTooLarge):
			msg = fmt.Sprintf("config file %s is too large (%v): check that -c names the config file", path, errors.Unwrap(err))
		case errors.Is(err, boundedfile.ErrNotRegular):
			msg = fmt.Sprintf("config file %s is %v: deployd reads its config from a regular file", path, errors.Unwrap(err))
		}
		return nil, &Error{Problems: []Problem{{File: path, Msg: msg, Err: err}}}
	}
	return Parse(path, data)
}

// Parse parses and validates a config file's contents. path names the file
// in messages, and relative paths in it resolve against its folder. On
// failure the error is an *Error listing every problem found.
func Parse(path string, data []byte) (*Config, error) {
	return parse(path, data, currentEnv())
}

type rawFile struct {
	Agent toml.Primitive `toml:"agent"`
	Apps  toml.Primitive `toml:"apps"`
}

func parse(path string, data []byte, env hostEnv) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil || path == "" {
		abs = filepath.Join(".", DefaultPath)
		if wd, err := os.Getwd(); err == nil {
			abs = filepath.Join(wd, DefaultPath)
		}
	}
	name := path
	if name == "" {
		name = DefaultPath
	}
	ps := &problems{file: name, lines: scanKeyLines(data)}
	var raw rawFile
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		ps.syntax(err, data)
		return nil, ps.err()
	}
	d := &decoder{
		md: &md, ps: ps, env: env, dir: filepath.Dir(abs),
		cpus: env.cpus(), failed: map[string]bool{},
	}
	c := &Config{Path: abs}
	c.Agent = d.agent(raw.Agent)
	c.Apps, c.AppNames = d.apps(raw.Apps)
	d.checkFolders(c)
	d.bindDefaults(c.Apps, c.AppNames)
	d.unknownKeys()
	if err := ps.err(); err != nil {
		return nil, err
	}
	c.Warnings = warnings(c, name, ps.lines)
	return c, nil
}

// syntax records a TOML syntax error with its line, column and the
// offending line underlined.
func (ps *problems) syntax(err error, data []byte) {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		ps.list = append(ps.list, Problem{File: ps.file, Msg: fmt.Sprintf("%s: %v; fix the TOML syntax", ps.file, err), Err: err})
		return
	}
	pl := placeSyntax(data, pe)
	msg := "syntax error: " + pl.what + showLine(data, toml.Position{Line: pl.line, Col: pl.col, Len: pl.width})
	ps.list = append(ps.list, Problem{File: ps.file, Line: pl.line, Col: pl.col, Msg: msg, Err: err})
}

// showLine returns "\n  LINE | text\n         ^^^" for pos, or "".
func showLine(data []byte, pos toml.Position) string {
	lines := strings.Split(string(data), "\n")
	if pos.Line < 1 || pos.Line > len(lines) {
		return ""
	}
	text := strings.ReplaceAll(strings.TrimRight(lines[pos.Line-1], "\r"), "\t", " ")
	col := min(max(pos.Col, 1), len(text)+1)
	width := min(max(pos.Len, 1), max(len(text)-col+1, 1))
	if len(text) > maxSnippet { // a window of the line around the place
		from := max(0, min(col-1-maxSnippet/2, len(text)-maxSnippet))
		to := min(len(text), from+maxSnippet)
		for from > 0 && !utf8.RuneStart(text[from]) {
			from--
		}
		for to < len(text) && !utf8.RuneStart(text[to]) {
			to++
		}
		pre, post := "", ""
		if from > 0 {
			pre = "..."
		}
		if to < len(text) {
			post = "..."
		}
		col, width = col-from+len(pre), min(width, to-col+1)
		text = pre + text[from:to] + post
	}
	gutter := fmt.Sprintf("%5d | ", pos.Line)
	return "\n" + gutter + text + "\n" + strings.Repeat(" ", len(gutter)+col-1) + strings.Repeat("^", width)
}
