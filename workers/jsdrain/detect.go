package jsdrain

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

var bunNames = map[string]bool{"bun": true, "bunx": true}
var denoNames = map[string]bool{"deno": true}

var shellRuntime = regexp.MustCompile(`(^|[\s;&|(/])(bun|bunx|deno)(\s|$)`)

func runtimeOf(name string) Runtime {
	switch b := filepath.Base(name); {
	case bunNames[b]:
		return Bun
	case denoNames[b]:
		return Deno
	}
	return None
}

// Detect tells which runtime argv runs, as the Node.js integration's
// Detect does for node: bun or deno itself, `env bun ...`, `sh -c "...
// bun ..."`, or a script whose #! line names bun or deno.
func Detect(argv []string) Runtime {
	if len(argv) == 0 {
		return None
	}
	if rt := runtimeOf(argv[0]); rt != None {
		return rt
	}
	switch filepath.Base(argv[0]) {
	case "env":
		for _, a := range argv[1:] {
			if !strings.HasPrefix(a, "-") && !strings.Contains(a, "=") {
				return runtimeOf(a)
			}
		}
		return None
	case "sh", "bash", "dash", "zsh":
		for i, a := range argv[1:] {
			if a == "-c" && i+2 < len(argv) {
				if m := shellRuntime.FindStringSubmatch(argv[i+2]); m != nil {
					return runtimeOf(m[2])
				}
			}
		}
		return None
	}
	return shebang(argv[0])
}

// shebang reads the #! line of path as the Node.js integration does: not
// blocking on a FIFO, a regular file only.
func shebang(path string) Runtime {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return None
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return None
	}
	b := make([]byte, 256)
	n, _ := f.Read(b)
	line, _, _ := bytes.Cut(b[:n], []byte{'\n'})
	if !bytes.HasPrefix(line, []byte("#!")) {
		return None
	}
	for _, w := range strings.Fields(string(line[2:])) {
		if rt := runtimeOf(w); rt != None {
			return rt
		}
	}
	return None
}
