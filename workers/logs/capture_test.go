package logs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

func capture(t *testing.T, r io.Reader, maxLine int) []string {
	t.Helper()
	var got []string
	if err := Capture(r, maxLine, func(s string) { got = append(got, s) }); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestCapture(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		maxLine  int
		want     []string
	}{
		{"lines", "a\nb\n", 0, []string{"a", "b"}},
		{"no trailing newline", "a\nlast", 0, []string{"a", "last"}},
		{"crlf and empty lines", "a\r\n\r\n\nb\r\n", 0, []string{"a", "", "", "b"}},
		{"empty input", "", 0, nil},
		{"exactly maxLine", "abcd\nabcd\r\n", 4, []string{"abcd", "abcd"}},
		{"split", "abcdefghij\nx", 4, []string{"abcd", "efgh", "ij", "x"}},
		{"split without newline", "abcdefghi", 4, []string{"abcd", "efgh", "i"}},
		{"split at a rune boundary", "ab€cd\n", 4, []string{"ab", "€c", "d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per Read, to cross every buffer boundary.
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got := capture(t, r, tc.maxLine)
				if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tc.want) {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			}
		})
	}
}

func TestCaptureReadError(t *testing.T) {
	boom := errors.New("boom")
	var got []string
	err := Capture(io.MultiReader(strings.NewReader("a\npartial"), iotest.ErrReader(boom)), 0, func(s string) { got = append(got, s) })
	if !errors.Is(err, boom) {
		t.Errorf("err %v, want boom", err)
	}
	if fmt.Sprint(got) != "[a partial]" {
		t.Errorf("got %q", got)
	}
}

// A 200 KiB line goes through a pipe, Capture and a Sink; the chunks in the
// file concatenate to the line.
func TestLongLineIsSplitNotLost(t *testing.T) {
	line := strings.Repeat("0123456789abcdef€", 200<<10/19+1)[:200<<10]
	line = strings.ToValidUTF8(line, "")
	path := testPath(t)
	s := open(t, Options{Path: path, Format: FormatRaw})

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(pw, line+"\nnext\n")
		pw.Close()
		done <- err
	}()
	if err := Capture(pr, 0, func(text string) { s.Write(Line{Text: text}) }); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	flush(t, s)

	chunks := readLines(t, path)
	if len(chunks) != 5 || chunks[4] != "next" {
		t.Fatalf("%d lines, want 4 chunks and next", len(chunks))
	}
	for _, c := range chunks[:4] {
		if len(c) > DefaultMaxLine || !utf8.ValidString(c) {
			t.Errorf("chunk of %d bytes (valid UTF-8: %v)", len(c), utf8.ValidString(c))
		}
	}
	if strings.Join(chunks[:4], "") != line {
		t.Error("chunks do not concatenate to the line")
	}
}

func TestTail(t *testing.T) {
	tl := NewTail(3)
	if got := tl.Lines(); len(got) != 0 {
		t.Errorf("empty tail: %q", got)
	}
	tl.Add("a")
	tl.Add("b")
	if got := fmt.Sprint(tl.Lines()); got != "[a b]" {
		t.Errorf("got %s", got)
	}
	for _, s := range []string{"c", "d", "e"} {
		tl.Add(s)
	}
	if got := fmt.Sprint(tl.Lines()); got != "[c d e]" {
		t.Errorf("got %s", got)
	}
}

// TestCaptureEveryLineOnce: 20 000 numbered lines through a pipe, written in
// chunks that cut lines anywhere, arrive each exactly once and in order.
func TestCaptureEveryLineOnce(t *testing.T) {
	const n = 20000
	var all strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&all, "test line %d\n", i)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		b := []byte(all.String())
		for size := 1; len(b) > 0; size = size%4093 + 7 {
			k := min(size, len(b))
			w.Write(b[:k])
			b = b[k:]
		}
		w.Close()
	}()
	got := capture(t, r, 0)
	r.Close()
	if len(got) != n {
		t.Errorf("%d lines captured, want %d", len(got), n)
	}
	for i, l := range got {
		if want := fmt.Sprintf("test line %d", i+1); l != want {
			t.Fatalf("line %d = %q, want %q (a line was lost, split or repeated)", i+1, l, want)
		}
	}
}
