package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreePort hands out distinct ports below the ephemeral range, where no
// outgoing connection (another parallel test's load) can take them.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	parallel(t)
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	first, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p >= first || p <= 1024 || seen[p] {
			t.Fatalf("FreePort gave %d (seen before: %v); want a new port in 1025-%d", p, seen[p], first-1)
		}
		seen[p] = true
	}
}
