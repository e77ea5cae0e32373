package addrpolicy

import (
	"fmt"
	"strconv"
	"strings"
)

// PortRange is the TCP ports Lo through Hi.
type PortRange struct{ Lo, Hi int }

// DefaultPorts are the ports an app's code may take without allow_ports:
// every unprivileged one.
var DefaultPorts = []PortRange{{1024, 65535}}

// ParsePorts reads allow_ports entries: "8080" or "8000-8099".
func ParsePorts(entries []string) ([]PortRange, error) {
	out := make([]PortRange, 0, len(entries))
	for _, e := range entries {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(e), "-")
		if !isRange {
			hi = lo
		}
		l, errL := port(lo)
		h, errH := port(hi)
		if errL != nil || errH != nil || l > h {
			return nil, fmt.Errorf(`bad port or range %q; write a port from 1 to 65535 or a range LOW-HIGH, e.g. "80" or "8000-8099"`, e)
		}
		out = append(out, PortRange{l, h})
	}
	return out, nil
}

func port(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return n, nil
}

// InRanges reports whether port is in one of rs.
func InRanges(rs []PortRange, port int) bool {
	for _, r := range rs {
		if port >= r.Lo && port <= r.Hi {
			return true
		}
	}
	return false
}

// FormatRanges writes rs as allow_ports would: "80, 1024-65535".
func FormatRanges(rs []PortRange) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r.Lo)
		if r.Hi != r.Lo {
			s[i] += "-" + strconv.Itoa(r.Hi)
		}
	}
	return strings.Join(s, ", ")
}
