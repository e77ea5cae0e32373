package config

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"
)

// maxInstances bounds an explicit instance count: a typo like 40000 must not
// fork that many processes.
const maxInstances = 1024

// hintError is an error whose text is a message with its fix, and which
// wraps the underlying cause (if any) without repeating it.
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// hint returns a *hintError wrapping cause (may be nil).
func hint(cause error, format string, args ...any) error {
	return &hintError{msg: fmt.Sprintf(format, args...), err: cause}
}

// fix returns "; e.g. KEY = EXAMPLE" for key, or "".
func fix(key []string) string {
	if ex := example(key); ex != "" {
		return "; e.g. " + ex
	}
	return ""
}

// duration decodes a duration string into dst. zeroOK allows "0" (= off).
func (d *decoder) duration(p toml.Primitive, key []string, dst *time.Duration, zeroOK bool) {
	s, ok := get[string](d, p, key)
	if !ok {
		return
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	switch {
	case err != nil:
		d.fail(key, strconv.Quote(s), hint(err, `not a duration; use a number with a unit, e.g. "30s" or "1m30s"`))
	case v < 0:
		d.fail(key, strconv.Quote(s), hint(nil, "must not be negative%s", fix(key)))
	case v == 0 && !zeroOK:
		d.fail(key, strconv.Quote(s), hint(nil, "must be more than 0%s", fix(key)))
	default:
		*dst = v
	}
}

// integer decodes an integer >= least into dst.
func (d *decoder) integer(p toml.Primitive, key []string, dst *int, least int) {
	n, ok := get[int64](d, p, key)
	if !ok {
		return
	}
	switch {
	case n < int64(least):
		d.fail(key, strconv.FormatInt(n, 10), hint(nil, "must be at least %d%s", least, fix(key)))
		return
	case n > math.MaxInt32:
		d.fail(key, strconv.FormatInt(n, 10), hint(nil, "too large%s", fix(key)))
		return
	}
	*dst = int(n)
}

func (d *decoder) boolean(p toml.Primitive, key []string, dst *bool) {
	if b, ok := get[bool](d, p, key); ok {
		*dst = b
	}
}

// size decodes a byte size ("512MiB" or an integer of bytes) into dst.
func (d *decoder) size(p toml.Primitive, key []string, dst *int64, zeroOK bool) {
	v, ok := get[any](d, p, key)
	if !ok {
		return
	}
	var n int64
	switch v := v.(type) {
	case int64:
		n = v
	case string:
		var err error
		if n, err = parseSize(v); err != nil {
			d.fail(key, strconv.Quote(v), err)
			return
		}
	default:
		d.typeProblem(key, p, `a size like "512MiB" or an integer of bytes`, nil)
		return
	}
	switch {
	case n < 0:
		d.fail(key, formatValue(v), hint(nil, "must not be negative%s", fix(key)))
	case n == 0 && !zeroOK:
		d.fail(key, formatValue(v), hint(nil, "must be more than 0%s", fix(key)))
	default:
		*dst = n
	}
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "kib": 1 << 10,
	"mb": 1e6, "mib": 1 << 20,
	"gb": 1e9, "gib": 1 << 30,
	"tb": 1e12, "tib": 1 << 40,
}

// parseSize parses "512MiB", "1.5 GB", "100" (bytes). Units are
// case-insensitive; KB is 1000 bytes, KiB 1024.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	end := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end < 0 {
		end = len(t)
	}
	num, err := strconv.ParseFloat(t[:end], 64)
	mult, ok := sizeUnits[strings.ToLower(strings.TrimSpace(t[end:]))]
	if err != nil || !ok || end == 0 {
		return 0, hint(err, `not a size; use a number with a unit B, KB, KiB, MB, MiB, GB or GiB, e.g. "512MiB"`)
	}
	v := math.Round(num * mult)
	if v >= math.MaxInt64 {
		return 0, hint(nil, `too large; use at most a few TiB, e.g. "512MiB"`)
	}
	return int64(v), nil
}

// parseSignal parses "SIGTERM", "term", "Sigusr2"...
func parseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, hint(nil, `unknown signal; use a signal name like "SIGTERM", "SIGINT", "SIGQUIT" or "SIGUSR2"`)
}

// resolveInstances turns "max", "N" or "-N" into a worker count for cpus.
func resolveInstances(spec string, cpus int) (int, error) {
	s := strings.ToLower(strings.TrimSpace(spec))
	const use = `use "max" (one per CPU), a count like 4, or "-1" (all CPUs but one)`
	if s == "max" {
		return max(cpus, 1), nil
	}
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 || strings.HasPrefix(rest, "+") || strings.HasPrefix(rest, "-") {
			return 0, hint(err, "not a worker count; %s", use)
		}
		return max(cpus-n, 1), nil
	}
	n, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return 0, hint(err, "not a worker count; %s", use)
	case n < 1:
		return 0, hint(nil, "must be at least 1; %s", use)
	case n > maxInstances:
		return 0, hint(nil, "at most %d workers; %s", maxInstances, use)
	}
	return n, nil
}

// instances decodes `instances` ("max", "N", "-N", N or -N) into app.
func (d *decoder) instances(p toml.Primitive, key []string, app *App) {
	v, ok := get[any](d, p, key)
	if !ok {
		return
	}
	var spec string
	switch v := v.(type) {
	case int64:
		spec = strconv.FormatInt(v, 10)
	case string:
		spec = v
	default:
		d.typeProblem(key, p, `"max", an integer or a string like "-1"`, nil)
		return
	}
	n, err := resolveInstances(spec, d.cpus)
	if err != nil {
		d.fail(key, formatValue(v), err)
		return
	}
	app.Instances, app.InstancesSpec = n, spec
}

// parseHealthPath checks the path of ready = "http:PATH" or health.path:
// an absolute request path (a query is fine), not a URL.
func parseHealthPath(p string) (string, error) {
	const eg = `e.g. "/healthz"`
	switch {
	case p == "":
		return "", hint(nil, "empty health path; write the path the app answers health checks on, %s", eg)
	case strings.Contains(p, "://"):
		return "", hint(nil, "a path, not a URL: deployd sends the request to each worker's own health socket; write only the path, %s", eg)
	case !strings.HasPrefix(p, "/"):
		return "", hint(nil, `the health path must start with "/", %s`, eg)
	case strings.ContainsAny(p, " \t\r\n"):
		return "", hint(nil, "the health path must not contain spaces; escape them (%%20), %s", eg)
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return "", hint(err, "not a valid request path: %v; write it like %s", err, eg)
	}
	return p, nil
}

// parseReady parses notify | node-ipc | log:REGEX | delay:DURATION | http:PATH.
func parseReady(s string) (Ready, error) {
	r := Ready{Raw: s}
	mode, arg, hasArg := strings.Cut(s, ":")
	switch ReadyMode(strings.ToLower(strings.TrimSpace(mode))) {
	case ReadyNotify:
		r.Mode = ReadyNotify
	case ReadyNodeIPC:
		r.Mode = ReadyNodeIPC
	case ReadyBind:
		r.Mode = ReadyBind
	case ReadyLog:
		re, err := regexp.Compile(arg)
		if err != nil {
			return r, hint(err, "bad regex: %v; fix the pattern (Go RE2 syntax), e.g. \"log:listening on\"", err)
		}
		if arg == "" {
			return r, hint(nil, `empty regex matches any line; write the text a ready worker prints, e.g. "log:listening on"`)
		}
		r.Mode, r.Regex = ReadyLog, re
		return r, nil
	case ReadyDelay:
		dur, err := time.ParseDuration(strings.TrimSpace(arg))
		if err != nil || dur <= 0 {
			return r, hint(err, `not a positive duration after "delay:"; write e.g. "delay:2s"`)
		}
		r.Mode, r.Delay = ReadyDelay, dur
		return r, nil
	case ReadyHTTP:
		if !hasArg {
			return r, hint(nil, `write the health path after "http:", e.g. "http:/healthz"`)
		}
		p, err := parseHealthPath(strings.TrimSpace(arg))
		if err != nil {
			return r, err
		}
		r.Mode, r.Path = ReadyHTTP, p
		return r, nil
	default:
		return r, hint(nil, `unknown ready mode; use "notify", "node-ipc", "log:REGEX", "delay:DURATION" or "http:PATH"`)
	}
	if hasArg {
		return r, hint(nil, "%q takes no argument; write %q", r.Mode, string(r.Mode))
	}
	return r, nil
}
