package config

import (
	"errors"
	"io/fs"
	"testing"
)

func TestUsableCPUs(t *testing.T) {
	tests := []struct {
		name     string
		affinity int
		files    map[string]string
		want     int
	}{
		{"no cgroup file", 8, nil, 8},
		{"no limit", 8, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "max 100000\n"}, 8},
		{"quota", 8, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "200000 100000\n"}, 2},
		{"quota rounds up", 8, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "150000 100000\n"}, 2},
		{"tiny quota", 8, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "1000 100000\n"}, 1},
		{"quota above affinity", 2, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "800000 100000\n"}, 2},
		{"parent limit", 8, map[string]string{"/proc/self/cgroup": "0::/a/b\n", "/cg/a/b/cpu.max": "max 100000", "/cg/a/cpu.max": "300000 100000"}, 3},
		{"root limit", 8, map[string]string{"/proc/self/cgroup": "0::/\n", "/cg/cpu.max": "400000 100000"}, 4},
		{"v1 only", 8, map[string]string{"/proc/self/cgroup": "4:memory:/x\n1:cpu:/\n"}, 8},
		{"garbage", 8, map[string]string{"/proc/self/cgroup": "0::/app\n", "/cg/app/cpu.max": "lots\n"}, 8},
		{"affinity fails", 0, nil, 0}, // falls back to runtime.NumCPU
	}
	for _, tt := range tests {
		src := cpuSource{
			affinity: func() (int, error) {
				if tt.affinity == 0 {
					return 0, errors.New("no affinity")
				}
				return tt.affinity, nil
			},
			readFile: func(path string) ([]byte, error) {
				if s, ok := tt.files[path]; ok {
					return []byte(s), nil
				}
				return nil, fs.ErrNotExist
			},
			cgroupRoot: "/cg",
		}
		got := src.count()
		if tt.want == 0 && got < 1 || tt.want != 0 && got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, got, tt.want)
		}
	}
	if n := UsableCPUs(); n < 1 {
		t.Errorf("UsableCPUs() = %d", n)
	}
}
