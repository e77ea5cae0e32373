package addrpolicy

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
)

func tcp(a string) Addr { return Addr{Network: "tcp", Address: a} }

// noListeners is a kernel where nothing listens.
func noListeners(Addr, []Addr) ([]string, error) { return nil, nil }

func TestDecide(t *testing.T) {
	others := []Use{
		{Owner: "app victim", Addr: tcp("127.0.0.1:9000")},
		{Owner: "app api", Addr: Addr{Network: "unix", Address: "/run/api.sock"}},
		{Owner: "[agent] metrics", Addr: tcp("127.0.0.1:9100")},
	}
	tests := []struct {
		name   string
		r      Request
		want   string // the accepted address, or "" for a refusal
		reason Reason
		words  []string // in the refusal
	}{
		{"free port", Request{Asked: tcp("0.0.0.0:3000")}, "tcp://0.0.0.0:3000", "", nil},
		{"no host", Request{Asked: tcp(":3000")}, "tcp://:3000", "", nil},
		{"mapped host", Request{Asked: tcp("[::ffff:127.0.0.1]:3000")}, "tcp://127.0.0.1:3000", "", nil},
		{"another app's port", Request{Asked: tcp("127.0.0.1:9000")}, "", OtherOwner,
			[]string{"tcp://127.0.0.1:9000", "app victim", "an address serves one app only", `listen = ["tcp://0.0.0.0:PORT"]`}},
		{"another app's port on every interface", Request{Asked: tcp("0.0.0.0:9000")}, "", OtherOwner, []string{"app victim"}},
		{"the agent's metrics", Request{Asked: tcp("127.0.0.1:9100")}, "", OtherOwner, []string{"[agent] metrics"}},
		{"privileged port", Request{Asked: tcp("0.0.0.0:81")}, "", PortDenied,
			[]string{"port 81", "privileged", "1024-65535", `allow_ports = ["81"]`}},
		{"privileged port allowed", Request{Asked: tcp("0.0.0.0:81"), Ports: []PortRange{{80, 81}}}, "tcp://0.0.0.0:81", "", nil},
		{"outside narrowed ports", Request{Asked: tcp("0.0.0.0:3000"), Ports: []PortRange{{8000, 8099}}}, "", PortDenied,
			[]string{"port 3000", "8000-8099"}},
		{"unix path", Request{Asked: Addr{Network: "unix", Address: "/home/u/x/app.sock"}}, "", UnixPath,
			[]string{"unix:///home/u/x/app.sock", `listen = ["unix:///home/u/x/app.sock"]`}},
		{"relative unix path", Request{Asked: Addr{Network: "unix", Address: "app.sock"}}, "", Malformed, nil},
		{"garbage", Request{Asked: Addr{Network: "tcp", Address: "evil\n:80"}}, "", Malformed, []string{"not an address"}},
		{"host name", Request{Asked: tcp("example.com:3000")}, "", Malformed, []string{"not an IP address"}},
		{"port 0", Request{Asked: tcp("0.0.0.0:0")}, "", Malformed, nil},
		{"unknown network", Request{Asked: Addr{Network: "udp", Address: "0.0.0.0:53"}}, "", Malformed, nil},
		{"in the listen list", Request{Asked: tcp("0.0.0.0:8080"), Listen: []Addr{tcp("127.0.0.1:8080")}}, "tcp://127.0.0.1:8080", "", nil},
		{"the listen list's unix path", Request{Asked: Addr{Network: "unix", Address: "/run/w//web.sock"},
			Listen: []Addr{{Network: "unix", Address: "/run/w/web.sock"}}}, "unix:///run/w/web.sock", "", nil},
		{"not in the listen list", Request{Asked: tcp("0.0.0.0:8081"), Listen: []Addr{tcp("127.0.0.1:8080")}}, "", NotListed,
			[]string{"not in its listen list (tcp://127.0.0.1:8080)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.r.App, tt.r.Others = "evil", others
			got, err := decide(tt.r, noListeners)
			if tt.want != "" {
				if err != nil || got.String() != tt.want {
					t.Fatalf("decide = %s, %v; want %s", got, err, tt.want)
				}
				return
			}
			var refused *RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, ErrRefused) || refused.Reason != tt.reason {
				t.Fatalf("decide = %s, %v; want a refusal for %s", got, err, tt.reason)
			}
			for _, w := range append(tt.words, "app evil asked to listen on", "refused (nothing was bound)") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// A port another process listens on is refused, naming it; the same
// socket is the app's own when it is on an address the app holds.
func TestDecideAsksTheKernel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_, err = Decide(Request{App: "evil", Asked: tcp("0.0.0.0:" + port)})
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Reason != HeldBy {
		t.Fatalf("Decide of a port this test listens on = %v; want refused as held", err)
	}
	if !strings.Contains(refused.By, "listens on 127.0.0.1:"+port) {
		t.Errorf("refusal names %q; want the socket that listens", refused.By)
	}
	if a, err := Decide(Request{App: "web", Asked: tcp("127.0.0.1:" + port), Held: []Addr{tcp("127.0.0.1:" + port)}}); err != nil {
		t.Errorf("Decide of the app's own held address = %s, %v; want accepted", a, err)
	}
}

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts([]string{"80", "8000-8099"})
	if err != nil || FormatRanges(got) != "80, 8000-8099" {
		t.Fatalf("ParsePorts = %v, %v", got, err)
	}
	for _, bad := range []string{"0", "65536", "90-80", "x", "80-", "-1"} {
		if _, err := ParsePorts([]string{bad}); err == nil {
			t.Errorf("ParsePorts(%q) accepted", bad)
		}
	}
}
