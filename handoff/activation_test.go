package handoff

import (
	"net/netip"
	"os"
	"strconv"
	"testing"
)

func TestActivatedMatches(t *testing.T) {
	tcp := func(s string) *Activated {
		ap := netip.MustParseAddrPort(s)
		return &Activated{Name: "web", Network: "tcp", Addr: ap.String(), ap: ap}
	}
	for _, tc := range []struct {
		sock             *Activated
		network, address string
		want             bool
	}{
		{tcp("127.0.0.1:8080"), "tcp", "127.0.0.1:8080", true},
		{tcp("127.0.0.1:8080"), "tcp4", "127.0.0.1:8080", true},
		{tcp("127.0.0.1:8080"), "tcp6", "127.0.0.1:8080", false},
		{tcp("127.0.0.1:8080"), "tcp", "127.0.0.1:8081", false},
		{tcp("127.0.0.1:8080"), "tcp", "127.0.0.2:8080", false},
		{tcp("127.0.0.1:8080"), "tcp", "localhost:8080", true},
		{tcp("[::ffff:127.0.0.1]:8080"), "tcp", "127.0.0.1:8080", true},
		{tcp("[::]:8080"), "tcp", ":8080", true},
		{tcp("[::]:8080"), "tcp", "0.0.0.0:8080", true},
		{tcp("0.0.0.0:8080"), "tcp", "[::]:8080", true},
		{tcp("[::]:8080"), "tcp", "127.0.0.1:8080", false},
		{tcp("127.0.0.1:8080"), "tcp", ":8080", false},
		{tcp("[::1]:8080"), "tcp6", "[::1]:8080", true},
		{tcp("[::1]:8080"), "unix", "/run/web.sock", false},
		{&Activated{Network: "unix", Addr: "/run/web.sock"}, "unix", "/run//web.sock", true},
		{&Activated{Network: "unix", Addr: "/run/web.sock"}, "unix", "/run/api.sock", false},
		{&Activated{Network: "unix", Addr: "/run/web.sock"}, "tcp", "127.0.0.1:8080", false},
	} {
		if got := tc.sock.Matches(tc.network, tc.address); got != tc.want {
			t.Errorf("%s %s matches %s %s = %v, want %v", tc.sock.Network, tc.sock.Addr, tc.network, tc.address, got, tc.want)
		}
	}
}

func TestActivationFromEnvIgnoresOtherPIDAndClearsEnv(t *testing.T) {
	t.Setenv(EnvListenFDs, "1")
	t.Setenv(EnvListenPID, strconv.Itoa(os.Getpid()+1))
	t.Setenv(EnvListenFDNames, "web")
	socks, skipped, err := ActivationFromEnv()
	if err != nil || len(socks) != 0 || len(skipped) != 0 {
		t.Fatalf("sockets for another pid were taken: %v %v %v", socks, skipped, err)
	}
	for _, k := range []string{EnvListenFDs, EnvListenPID, EnvListenFDNames} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%s left in the environment", k, v)
		}
	}
	t.Setenv(EnvListenFDs, "x")
	t.Setenv(EnvListenPID, strconv.Itoa(os.Getpid()))
	if _, _, err := ActivationFromEnv(); err == nil {
		t.Error("a bad LISTEN_FDS must be an error")
	}
}
