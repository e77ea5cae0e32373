package handoff

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/deployd/deployd/internal/sockdiag"
)

// AddrInUseError is a listen address another process holds. It matches
// ErrAddressInUse with errors.Is and unwraps to the bind error.
type AddrInUseError struct {
	URL    string // as configured (tcp://..., unix://...), or network and address
	Holder string // "nginx (pid 812)", or "" when it cannot be found
	Err    error  // the bind error (EADDRINUSE), or nil for a live unix socket
}

func (e *AddrInUseError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "another process"
		if os.Geteuid() != 0 {
			holder += " (run as root to see which)"
		}
	}
	return fmt.Sprintf("%s is already in use by %s; stop it or choose another address", e.URL, holder)
}

// Is makes errors.Is(err, ErrAddressInUse) true.
func (e *AddrInUseError) Is(target error) bool { return target == ErrAddressInUse }

func (e *AddrInUseError) Unwrap() error { return e.Err }

// Holder names the process that listens on network/address, as
// "comm (pid N)", or returns "" when it cannot be found: it reads the
// socket's inode in /proc/net/{tcp,tcp6,unix}, then looks for the process
// that has "socket:[inode]" among its /proc/PID/fd (other users' processes
// are visible only to root).
func Holder(network, address string) string {
	inodes := map[uint64]bool{}
	for ino := range listeningInodes(network, address) {
		if v, err := strconv.ParseUint(ino, 10, 64); err == nil {
			inodes[v] = true
		}
	}
	return sockdiag.Holder(inodes)
}

// listeningInodes returns the inodes of the listening sockets on address.
// A TCP address matches by port: any listener on that port may be what
// stops a bind (0.0.0.0 against 127.0.0.1).
func listeningInodes(network, address string) map[string]bool {
	out := map[string]bool{}
	if network == "unix" {
		scanProc("/proc/net/unix", func(f []string) {
			// Num RefCount Protocol Flags Type St Inode Path; St 01 is listening.
			if len(f) >= 8 && f[5] == "01" && f[7] == address {
				out[f[6]] = true
			}
		})
		return out
	}
	_, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return out
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return out
	}
	want := fmt.Sprintf(":%04X", port)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		scanProc(file, func(f []string) {
			// sl local_address rem_address st ... uid timeout inode; st 0A is LISTEN.
			if len(f) >= 10 && f[3] == "0A" && strings.HasSuffix(f[1], want) {
				out[f[9]] = true
			}
		})
	}
	return out
}

// scanProc calls fn with the fields of each line of a /proc table after its header.
func scanProc(path string, fn func([]string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fn(strings.Fields(sc.Text()))
	}
}
