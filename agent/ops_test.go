package agent

import "testing"

func TestParseScale(t *testing.T) {
	for _, tc := range []struct {
		in   string
		cur  int
		want int
		ok   bool
	}{
		{"4", 2, 4, true}, {"+1", 2, 3, true}, {"-1", 2, 1, true}, {"-2", 2, 0, false},
		{"0", 2, 0, false}, {"x", 2, 0, false}, {"2000", 1, 0, false}, {" 3 ", 1, 3, true},
	} {
		got, err := parseScale(tc.in, tc.cur)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseScale(%q, %d) = %d, %v; want %d ok=%v", tc.in, tc.cur, got, err, tc.want, tc.ok)
		}
	}
}
