package config

import (
	"strings"

	"github.com/BurntSushi/toml"
)

// syntaxPlace is where a TOML syntax mistake really is, and what to say
// about it. BurntSushi/toml reports the place where its lexer noticed the
// problem (for a missing `]` that is the next line's first token, and its
// column is off by a line when the token starts a line); syntaxPlace moves
// the position back to the mistake and says what was expected.
type syntaxPlace struct {
	line, col, width int
	what             string // the problem and its fix
}

// placeSyntax finds the real place of pe in data.
func placeSyntax(data []byte, pe toml.ParseError) syntaxPlace {
	text := string(data)
	start := min(max(pe.Position.Start, 0), len(text))
	at := func(off, width int, what string) syntaxPlace {
		line, col := lineCol(text, off)
		return syntaxPlace{line: line, col: col, width: max(width, 1), what: what}
	}
	msg := pe.Message
	switch {
	case strings.HasPrefix(msg, "expected a comma (',') or array terminator (']')"):
		if end, ok := endOfPreviousLine(text, start); ok {
			return at(end, 1, "the array is missing its closing ]: add ] here (or a comma, if more items follow)")
		}
		return at(start, pe.Position.Len, "expected a comma or ] between array items, found "+token(text, start))
	case strings.HasPrefix(msg, "expected a comma or an inline table terminator '}'"):
		if end, ok := endOfPreviousLine(text, start); ok {
			return at(end, 1, "the inline table is missing its closing }: add } here (an inline table fits on one line)")
		}
		return at(start, pe.Position.Len, "expected a comma or } in the inline table, found "+token(text, start))
	case strings.Contains(msg, "to end table name"):
		if start < len(text) && (text[start] == '\n' || text[start] == '\r') {
			return at(start, 1, "the table header is missing its closing ]: write it as [name]")
		}
		return at(start, 1, "unexpected "+token(text, start)+" in the table header; write it as [name] or [name.sub]")
	case msg == "strings cannot contain newlines":
		if open := strings.LastIndexAny(text[lineStart(text, start):start], `"'`); open >= 0 {
			return at(lineStart(text, start)+open, 1, "the string that starts here is not closed: add the closing quote on this line")
		}
	case strings.HasPrefix(msg, "unexpected EOF; expected '\"\"\"'"), strings.HasPrefix(msg, "unexpected EOF; expected \"'''\""):
		delim := `"""`
		if strings.Contains(msg, "'''") {
			delim = `'''`
		}
		if open := strings.LastIndex(text, delim); open >= 0 {
			return at(open, 3, "the multi-line string that starts here is not closed: add "+delim+" where it ends")
		}
	case strings.HasPrefix(msg, "expected '.' or '='"):
		return at(start, pe.Position.Len, "expected = between the key and its value, found "+token(text, start)+"; write key = value")
	case strings.HasPrefix(msg, "expected value but found"):
		return at(start, pe.Position.Len, "not a TOML value: strings need quotes (\""+text[start:min(start+pe.Position.Len, len(text))]+
			"\"), numbers and true/false do not")
	case strings.HasSuffix(msg, "has already been defined."):
		key := strings.TrimSuffix(strings.TrimPrefix(msg, "Key '"), "' has already been defined.")
		return at(start, pe.Position.Len, key+" is already defined above: remove one of the two")
	}
	return at(start, pe.Position.Len, msg+"; fix the TOML here (strings need quotes, tables are [name], one key = value per line)")
}

// lineCol converts a byte offset of text to a 1-based line and column.
func lineCol(text string, off int) (line, col int) {
	off = min(max(off, 0), len(text))
	ls := lineStart(text, off)
	return strings.Count(text[:ls], "\n") + 1, off - ls + 1
}

// lineStart is the offset of the first byte of off's line.
func lineStart(text string, off int) int {
	return strings.LastIndexByte(text[:off], '\n') + 1
}

// endOfPreviousLine returns the offset just past the last TOML content
// (not blank, not a comment) before off's line, when off is the first token
// on its line: that is where a closing bracket was forgotten.
func endOfPreviousLine(text string, off int) (int, bool) {
	ls := lineStart(text, off)
	if strings.TrimSpace(text[ls:off]) != "" || ls == 0 {
		return 0, false // the token follows others on its line: a comma is missing there
	}
	for end := ls - 1; end > 0; {
		begin := lineStart(text, end)
		content := strings.TrimRight(stripComment(text[begin:end]), " \t\r")
		if content != "" {
			return begin + len(content), true
		}
		end = begin - 1
	}
	return 0, false
}

// stripComment removes a trailing # comment from one line of TOML,
// skipping # inside basic or literal strings.
func stripComment(line string) string {
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0 && c == '\\' && quote == '"':
			i++
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\''):
			quote = c
		case quote == 0 && c == '#':
			return line[:i]
		}
	}
	return line
}

// token names the text at off for a message: `[`, `"`, a word, or "the end of the line".
func token(text string, off int) string {
	if off >= len(text) {
		return "the end of the file"
	}
	if text[off] == '\n' || text[off] == '\r' {
		return "the end of the line"
	}
	end := off + 1
	for end < len(text) && isBare(text[off]) && isBare(text[end]) {
		end++
	}
	return "`" + text[off:end] + "`"
}

func isBare(c byte) bool {
	return c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
