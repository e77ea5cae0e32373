package config

import (
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// keyLines maps a dotted key (as toml.Key.String writes it) to the line
// where it is first written. BurntSushi/toml keeps key positions private
// (MetaData.keyInfo), so scanKeyLines finds them with a light scan of the
// file: table headers, `key = value` lines (dotted keys too) and the keys of
// inline tables. It is approximate by design: find falls back to the line of
// the enclosing table, or 0.
type keyLines map[string]int

func keyString(key []string) string { return toml.Key(key).String() }

// find returns the line of key, else of its closest parent, else 0.
func (kl keyLines) find(key []string) int {
	for n := len(key); n > 0; n-- {
		if line, ok := kl[keyString(key[:n])]; ok {
			return line
		}
	}
	return 0
}

// set records key and each of its parents from index from on, keeping the
// first line seen.
func (kl keyLines) set(key []string, from, line int) {
	for n := max(from, 1); n <= len(key); n++ {
		k := keyString(key[:n])
		if _, ok := kl[k]; !ok {
			kl[k] = line
		}
	}
}

func scanKeyLines(data []byte) keyLines {
	kl := keyLines{}
	var table []string
	multiline := "" // closing delimiter while inside a multi-line string
	text := strings.TrimPrefix(string(data), "\ufeff")
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		if multiline != "" {
			if strings.Count(line, multiline)%2 == 1 {
				multiline = ""
			}
			continue
		}
		s := strings.TrimSpace(line)
		if s == "" || s[0] == '#' {
			continue
		}
		if s[0] == '[' {
			if key, ok := parseHeader(s); ok {
				table = key
				kl.set(key, 1, n)
			}
			continue
		}
		parts, rest, ok := parseKey(s)
		if !ok || !strings.HasPrefix(rest, "=") {
			continue
		}
		full := append(slices.Clone(table), parts...)
		kl.set(full, len(table)+1, n)
		value := strings.TrimSpace(rest[1:])
		if strings.HasPrefix(value, "{") {
			scanInline(kl, full, value, n)
		}
		multiline = openMultiline(value)
	}
	return kl
}

// parseHeader parses "[a.b]" or "[[a.b]]" (with an optional comment).
func parseHeader(s string) ([]string, bool) {
	inner := strings.TrimLeft(s, "[")
	key, rest, ok := parseKey(inner)
	if !ok || !strings.HasPrefix(rest, "]") {
		return nil, false
	}
	rest = strings.TrimSpace(strings.TrimLeft(rest, "]"))
	return key, rest == "" || rest[0] == '#'
}

// openMultiline returns the delimiter of a multi-line string that value
// opens and does not close, or "".
func openMultiline(value string) string {
	for _, delim := range []string{`"""`, `'''`} {
		if strings.HasPrefix(value, delim) && strings.Count(value, delim)%2 == 1 {
			return delim
		}
	}
	return ""
}

// parseKey parses a possibly dotted, possibly quoted key at the start of s
// and returns its parts and the trimmed rest of s.
func parseKey(s string) (parts []string, rest string, ok bool) {
	for {
		s = strings.TrimLeft(s, " \t")
		part, after, ok := parseKeyPart(s)
		if !ok {
			return nil, "", false
		}
		parts = append(parts, part)
		s = strings.TrimLeft(after, " \t")
		if !strings.HasPrefix(s, ".") {
			return parts, s, true
		}
		s = s[1:]
	}
}

func parseKeyPart(s string) (part, rest string, ok bool) {
	switch {
	case strings.HasPrefix(s, `"`):
		end := 1
		for end < len(s) && s[end] != '"' {
			if s[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(s) {
			return "", "", false
		}
		part, err := strconv.Unquote(s[:end+1])
		if err != nil {
			part = s[1:end]
		}
		return part, s[end+1:], true
	case strings.HasPrefix(s, "'"):
		end := strings.IndexByte(s[1:], '\'')
		if end < 0 {
			return "", "", false
		}
		return s[1 : end+1], s[end+2:], true
	}
	end := strings.IndexFunc(s, func(r rune) bool { return !isBareKeyChar(r) })
	if end < 0 {
		end = len(s)
	}
	if end == 0 {
		return "", "", false
	}
	return s[:end], s[end:], true
}

func isBareKeyChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
}

// scanInline records the keys of the inline table s ("{ a = 1, b = { c = 2 } }")
// under prefix, all on line.
func scanInline(kl keyLines, prefix []string, s string, line int) {
	s = s[1:] // the '{'
	for {
		parts, rest, ok := parseKey(s)
		if !ok || !strings.HasPrefix(rest, "=") {
			return
		}
		key := append(slices.Clone(prefix), parts...)
		kl.set(key, len(prefix)+1, line)
		value := strings.TrimLeft(rest[1:], " \t")
		if strings.HasPrefix(value, "{") {
			scanInline(kl, key, value, line)
		}
		end := skipValue(value)
		if end >= len(value) || value[end] != ',' {
			return
		}
		s = value[end+1:]
	}
}

// skipValue returns the index of the ',' or '}' that ends the TOML value at
// the start of s (brackets and strings skipped), or len(s).
func skipValue(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'':
			i = skipString(s, i)
		case '[', '{':
			depth++
		case ']':
			depth--
		case '}', ',':
			if depth == 0 {
				return i
			}
			if c == '}' {
				depth--
			}
		}
	}
	return len(s)
}

// skipString returns the index of the quote closing the string that opens
// at s[i], or len(s).
func skipString(s string, i int) int {
	quote := s[i]
	for i++; i < len(s); i++ {
		if s[i] == '\\' && quote == '"' {
			i++
			continue
		}
		if s[i] == quote {
			return i
		}
	}
	return len(s)
}
