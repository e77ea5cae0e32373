package bindtrap

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// envShim makes the test binary the shim: InstallAndSend on the fd it
// names, then exec of the rest of argv.
const envShim = "BINDTRAP_TEST_SHIM"

func TestMain(m *testing.M) {
	if v := os.Getenv(envShim); v != "" {
		fd, _ := strconv.Atoi(v)
		if err := InstallAndSend(fd); err != nil {
			fmt.Fprintln(os.Stderr, "shim:", err)
			os.Exit(126)
		}
		env := []string{}
		for _, kv := range os.Environ() {
			if len(kv) < len(envShim) || kv[:len(envShim)] != envShim {
				env = append(env, kv)
			}
		}
		err := syscall.Exec(os.Args[1], os.Args[1:], env)
		fmt.Fprintln(os.Stderr, "shim: exec:", err)
		os.Exit(127)
	}
	if v := os.Getenv(envProbe); v != "" {
		os.Exit(probeBind(v))
	}
	os.Exit(m.Run())
}

// envProbe makes the test binary an app that binds [::]:PORT with the
// raw system call and prints what it returned, as libc passes it on.
const envProbe = "BINDTRAP_TEST_PROBE"

func probeBind(port string) int {
	p, _ := strconv.Atoi(port)
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM, 0)
	if err != nil {
		fmt.Println("socket:", err)
		return 1
	}
	sa := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(sa, unix.AF_INET6)
	binary.BigEndian.PutUint16(sa[2:], uint16(p))
	r1, _, errno := unix.RawSyscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa)))
	fmt.Printf("bind returned %d errno %d\n", int(r1), int(errno))
	return 0
}
