package config

import "testing"

func TestScanKeyLines(t *testing.T) {
	src := `# comment
[agent]
socket = "x" # 3
"state_dir" = 'y'

[apps.web]            # 6
command = [
  "a = b",
  "c",
]
env = { MODE = "prod", "X.Y" = "1", N = { deep = 1 } }  # 11
restart.backoff = "1s"
desc = """
fake = 1
"""
[apps."my.app"]       # 16
cwd = "."
[[arr]]               # 18
k = 1
`
	kl := scanKeyLines([]byte(src))
	tests := []struct {
		key  []string
		line int
	}{
		{[]string{"agent"}, 2},
		{[]string{"agent", "socket"}, 3},
		{[]string{"agent", "state_dir"}, 4},
		{[]string{"agent", "nope"}, 2},
		{[]string{"apps", "web"}, 6},
		{[]string{"apps"}, 6},
		{[]string{"apps", "web", "command"}, 7},
		{[]string{"apps", "web", "env"}, 11},
		{[]string{"apps", "web", "env", "MODE"}, 11},
		{[]string{"apps", "web", "env", "X.Y"}, 11},
		{[]string{"apps", "web", "env", "N", "deep"}, 11},
		{[]string{"apps", "web", "restart"}, 12},
		{[]string{"apps", "web", "restart", "backoff"}, 12},
		{[]string{"apps", "web", "desc"}, 13},
		{[]string{"apps", "web", "fake"}, 6}, // inside a multi-line string
		{[]string{"apps", "my.app", "cwd"}, 17},
		{[]string{"arr", "k"}, 19},
		{[]string{"other"}, 0},
	}
	for _, tt := range tests {
		if got := kl.find(tt.key); got != tt.line {
			t.Errorf("find(%s) = %d, want %d", keyString(tt.key), got, tt.line)
		}
	}
}
