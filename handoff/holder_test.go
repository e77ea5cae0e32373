package handoff

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const holdEnv = "DEPLOYD_HANDOFF_TEST_HOLD" // network=address for the hold-listener helper

func init() { helpers["hold-listener"] = helperHoldListener }

// helperHoldListener listens on $holdEnv, says "listening", and holds the
// socket until its stdin closes.
func helperHoldListener() int {
	network, address, _ := strings.Cut(os.Getenv(holdEnv), "=")
	l, err := net.Listen(network, address)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// holdInChild starts a child process that listens on network/address and
// returns its pid; the child exits at cleanup.
func holdInChild(t *testing.T, network, address string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=hold-listener", holdEnv+"="+network+"="+address, noRaceExitSleep)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("holder child: %q, %v", line, err)
	}
	return cmd.Process.Pid
}

func TestBusyAddressNamesHolder(t *testing.T) {
	for _, tc := range []struct{ network, address string }{
		{"tcp", freeAddr(t)},
		{"tcp", "[::1]:" + strings.Split(freeAddr(t), ":")[1]},
		{"unix", filepath.Join(shortDir(t), "held.sock")},
	} {
		t.Run(tc.network+" "+tc.address, func(t *testing.T) {
			if strings.HasPrefix(tc.address, "[::1]") {
				if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
					t.Skip("no IPv6 loopback")
				} else {
					l.Close()
				}
			}
			pid := holdInChild(t, tc.network, tc.address)
			l, err := Open(tc.network, tc.address, false)
			if err == nil {
				l.Close()
				t.Fatalf("Open(%s %s) on a held address: no error", tc.network, tc.address)
			}
			var inUse *AddrInUseError
			if !errors.As(err, &inUse) || !errors.Is(err, ErrAddressInUse) {
				t.Fatalf("error %v is not an *AddrInUseError", err)
			}
			if tc.network == "tcp" && !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("error does not wrap EADDRINUSE: %v", err)
			}
			holder := fmt.Sprintf("handoff.test (pid %d)", pid) // our own child: visible without root
			want := fmt.Sprintf("%s://%s is already in use by %s; stop it or choose another address", tc.network, tc.address, holder)
			if err.Error() != want {
				t.Errorf("error:\n  %s\nwant\n  %s", err, want)
			}
		})
	}
}
