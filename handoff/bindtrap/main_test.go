package bindtrap

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
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
	os.Exit(m.Run())
}
