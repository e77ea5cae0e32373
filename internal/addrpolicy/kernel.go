package addrpolicy

import (
	"fmt"
	"net"
	"strconv"

	"github.com/deployd/deployd/internal/sockdiag"
)

// kernelListeners asks the kernel (sock_diag) for the TCP sockets that
// listen where a would, leaving out those on an address of skip (the
// app's own listeners), and says of each "nginx (pid 812) listens on
// 0.0.0.0:80" (a uid where the process cannot be seen).
func kernelListeners(a Addr, skip []Addr) ([]string, error) {
	port := portOf(a)
	socks, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(s *sockdiag.Socket) bool {
		if int(s.Local.Port()) != port {
			return false
		}
		local := Addr{Network: "tcp", Address: net.JoinHostPort(s.Local.Addr().Unmap().String(), strconv.Itoa(port))}
		if !Overlap(local, a) {
			return false
		}
		for _, h := range skip {
			if Overlap(local, h) {
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range socks {
		who := sockdiag.Holder(map[uint64]bool{s.Inode: true})
		if who == "" {
			who = fmt.Sprintf("a process of uid %d", s.UID)
		}
		out = append(out, fmt.Sprintf("%s listens on %s", who, s.Local))
	}
	return out, nil
}
