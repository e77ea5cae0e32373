package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/deployd/deployd/internal/atomicfile"
)

// The config file is edited as text (`deployd start FILE`, `deployd delete`,
// `deployd reload --env`): whatever the user wrote around the app that
// changes — comments, blank lines, the order of keys, quoting — stays as
// written. Each edit is checked twice before anything is written: the
// edited file decodes to exactly the old document plus (or minus) the
// change, and it loads as a valid config.

// ErrAppExists and ErrNoApp are returned by the edits for an app name that
// is already in the file, or not in it.
var (
	ErrAppExists = errors.New("config: app already in the file")
	ErrNoApp     = errors.New("config: app not in the file")
)

// AppendApp returns data with block, the text of an [apps.NAME] table (and
// its sub-tables), appended after a blank line. The rest of data is kept
// byte for byte.
func AppendApp(data []byte, name, block string) ([]byte, error) {
	before, err := decodeDoc(data)
	if err != nil {
		return nil, err
	}
	if _, ok := appsOf(before)[name]; ok {
		return nil, fmt.Errorf("%w: [apps.%s]", ErrAppExists, name)
	}
	out := strings.TrimRight(string(data), " \t\r\n")
	if out != "" {
		out += "\n\n"
	}
	out += strings.TrimRight(block, "\n") + "\n"
	after, err := decodeDoc([]byte(out))
	if err != nil {
		return nil, fmt.Errorf("config: the new app's table does not parse: %w", err)
	}
	added, ok := appsOf(after)[name]
	if !ok {
		return nil, fmt.Errorf("config: the new text does not define [apps.%s]", name)
	}
	want := cloneDoc(before)
	setApp(want, name, added)
	if !reflect.DeepEqual(want, after) {
		return nil, fmt.Errorf("config: appending [apps.%s] would change other settings; add it by hand", name)
	}
	return []byte(out), nil
}

// RemoveApp returns data without the [apps.NAME] table, its sub-tables
// ([apps.NAME.env], ...) and the comment lines directly above each of their
// headers. Everything else is kept byte for byte. An app written other
// than as [apps.NAME] tables (an inline table, dotted keys) is refused.
func RemoveApp(data []byte, name string) ([]byte, error) {
	before, err := decodeDoc(data)
	if err != nil {
		return nil, err
	}
	if _, ok := appsOf(before)[name]; !ok {
		return nil, fmt.Errorf("%w: [apps.%s]", ErrNoApp, name)
	}
	lines := splitLines(string(data))
	sections := tableSections(lines)
	drop := make([]bool, len(lines))
	for _, s := range sections {
		if !underApp(s.key, name) {
			continue
		}
		for i := s.start; i < s.end; i++ {
			drop[i] = true
		}
	}
	var b strings.Builder
	for i, l := range lines {
		if !drop[i] {
			b.WriteString(l)
		}
	}
	out := trimEnd(b.String())
	after, err := decodeDoc([]byte(out))
	if err != nil {
		return nil, fmt.Errorf("config: removing [apps.%s] leaves a file that does not parse (%w); remove it by hand", name, err)
	}
	_, still := appsOf(after)[name]
	want := cloneDoc(before)
	delete(appsOf(want), name)
	if len(appsOf(want)) == 0 {
		// [apps] itself may remain as an empty table or vanish: both mean no apps.
		delete(want, "apps")
		delete(after, "apps")
	}
	if still || !reflect.DeepEqual(want, after) {
		return nil, fmt.Errorf("config: [apps.%s] is not written as [apps.%s] tables only (an inline table or dotted keys?); remove it by hand", name, name)
	}
	return []byte(out), nil
}

// SetAppKey returns data with key = value (value is TOML, e.g. `"production"`)
// in the [apps.NAME] table: the line of an existing key is replaced (its
// indentation and trailing comment kept), else the line is added after
// the table's last key.
func SetAppKey(data []byte, name, key, value string) ([]byte, error) {
	before, err := decodeDoc(data)
	if err != nil {
		return nil, err
	}
	if _, ok := appsOf(before)[name]; !ok {
		return nil, fmt.Errorf("%w: [apps.%s]", ErrNoApp, name)
	}
	lines := splitLines(string(data))
	var sec *section
	for _, s := range tableSections(lines) {
		if len(s.key) == 2 && s.key[0] == "apps" && s.key[1] == name && !s.array {
			sec = &s
			break
		}
	}
	if sec == nil {
		return nil, fmt.Errorf("config: no [apps.%s] table header in the file; set %s by hand", name, key)
	}
	line := key + " = " + value + "\n"
	insert, replace := -1, -1
	for i := sec.header + 1; i < sec.end; i++ {
		if !sec.top[i-sec.start] {
			insert = i + 1 // inside a value that spans lines: after its end
			continue
		}
		s := strings.TrimSpace(lines[i])
		if s == "" || s[0] == '#' {
			continue
		}
		insert = i + 1
		if parts, rest, ok := parseKey(s); ok && len(parts) == 1 && parts[0] == key && strings.HasPrefix(rest, "=") {
			replace = i
		}
	}
	switch {
	case replace >= 0:
		old := lines[replace]
		indent := old[:len(old)-len(strings.TrimLeft(old, " \t"))]
		comment := ""
		if stripped := stripComment(strings.TrimRight(old, "\r\n")); len(stripped) < len(strings.TrimRight(old, "\r\n")) {
			comment = " " + strings.TrimSpace(strings.TrimRight(old, "\r\n")[len(stripped):])
		}
		lines[replace] = indent + key + " = " + value + comment + "\n"
	case insert >= 0:
		lines = append(lines[:insert], append([]string{line}, lines[insert:]...)...)
	default:
		lines = append(lines[:sec.header+1], append([]string{line}, lines[sec.header+1:]...)...)
	}
	out := strings.Join(lines, "")
	after, err := decodeDoc([]byte(out))
	if err != nil {
		return nil, fmt.Errorf("config: setting %s in [apps.%s] does not parse (%w); set it by hand", key, name, err)
	}
	var v map[string]any
	if _, err := toml.Decode(key+" = "+value, &v); err != nil {
		return nil, fmt.Errorf("config: %s = %s: %w", key, value, err)
	}
	want := cloneDoc(before)
	appsOf(want)[name].(map[string]any)[key] = v[key]
	if !reflect.DeepEqual(want, after) {
		return nil, fmt.Errorf("config: setting %s in [apps.%s] would change other settings; set it by hand", key, name)
	}
	return []byte(out), nil
}

// WriteEdited validates data as the config at path (Parse) and, when it
// loads, replaces the file atomically, keeping its mode. Nothing is written
// for a config that does not load.
func WriteEdited(path string, data []byte) (*Config, error) {
	cfg, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := atomicfile.WriteFile(path, data, mode); err != nil {
		return nil, err
	}
	return cfg, nil
}

// section is one table of the file: from the comment lines directly above
// its header (start) to the next section's start (end).
type section struct {
	key        []string
	array      bool // [[key]]
	start, end int
	header     int    // line of the header
	top        []bool // per line of the section: outside a multi-line value
}

// tableSections splits lines into the part before the first header (not
// returned) and one section per table header.
func tableSections(lines []string) []section {
	top := topLevelLines(lines)
	var out []section
	for i, l := range lines {
		s := strings.TrimSpace(l)
		if !top[i] || !strings.HasPrefix(s, "[") {
			continue
		}
		key, ok := parseHeader(s)
		if !ok {
			continue
		}
		start := i
		for start > 0 && top[start-1] && strings.HasPrefix(strings.TrimSpace(lines[start-1]), "#") {
			start--
		}
		if n := len(out); n > 0 {
			out[n-1].end = start
		}
		out = append(out, section{key: key, array: strings.HasPrefix(s, "[["), start: start, header: i})
	}
	for i := range out {
		if i == len(out)-1 {
			out[i].end = len(lines)
		}
		out[i].top = top[out[i].start:out[i].end]
	}
	return out
}

// topLevelLines reports for each line whether it starts outside a value
// that spans lines (a multi-line string or array).
func topLevelLines(lines []string) []bool {
	top := make([]bool, len(lines))
	multiline, depth := "", 0
	for i, l := range lines {
		top[i] = multiline == "" && depth == 0
		switch {
		case multiline != "":
			if strings.Count(l, multiline)%2 == 1 {
				multiline = ""
			}
		case depth > 0:
			depth = max(depth+bracketDepth(stripComment(l)), 0)
		default:
			s := strings.TrimSpace(l)
			if s == "" || s[0] == '#' || s[0] == '[' {
				continue
			}
			_, rest, ok := parseKey(s)
			if !ok || !strings.HasPrefix(rest, "=") {
				continue
			}
			value := strings.TrimSpace(rest[1:])
			if multiline = openMultiline(value); multiline == "" {
				depth = max(bracketDepth(stripComment(value)), 0)
			}
		}
	}
	return top
}

// bracketDepth is how many more [ and { than ] and } s has outside strings.
func bracketDepth(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\'':
			i = skipString(s, i)
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		}
	}
	return depth
}

// underApp reports whether a table key is [apps.NAME] or below it.
func underApp(key []string, name string) bool {
	return len(key) >= 2 && key[0] == "apps" && key[1] == name
}

// splitLines splits s into lines that keep their "\n".
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if last := len(lines) - 1; lines[last] == "" {
		lines = lines[:last]
	} else {
		lines[last] += "\n" // so that a line can follow it
	}
	return lines
}

// trimEnd drops the blank lines a removal left at the end of the file.
func trimEnd(s string) string {
	out := strings.TrimRight(s, " \t\r\n")
	if out == "" {
		return ""
	}
	return out + "\n"
}

func decodeDoc(data []byte) (map[string]any, error) {
	doc := map[string]any{}
	if _, err := toml.Decode(string(data), &doc); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return doc, nil
}

// appsOf returns doc's apps table (nil when there is none).
func appsOf(doc map[string]any) map[string]any {
	apps, _ := doc["apps"].(map[string]any)
	return apps
}

func setApp(doc map[string]any, name string, app any) {
	apps := appsOf(doc)
	if apps == nil {
		apps = map[string]any{}
		doc["apps"] = apps
	}
	apps[name] = app
}

// cloneDoc copies the tables of doc (values are not changed in place).
func cloneDoc(doc map[string]any) map[string]any {
	out := make(map[string]any, len(doc))
	for k, v := range doc {
		if m, ok := v.(map[string]any); ok {
			v = cloneDoc(m)
		}
		out[k] = v
	}
	return out
}
