package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// maxRSSEnv makes the test binary a small helper (TestMain): it runs the
// JSON argv in it, passes the child's stderr through, prints the child's
// max RSS in KiB on stdout and exits with the child's status. A process
// started by this (large) test process would inherit its high-water mark.
const maxRSSEnv = "DEPLOYD_TEST_MAXRSS_ARGV"

func maxRSSHelper(argvJSON string) int {
	var argv []string
	if err := json.Unmarshal([]byte(argvJSON), &argv); err != nil || len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "maxrss helper: bad argv:", argvJSON)
		return 125
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = CleanEnv()
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "maxrss helper:", err)
		return 125
	}
	fmt.Println(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)
	return cmd.ProcessState.ExitCode()
}

// runMaxRSS runs argv through the helper within d and returns its max RSS
// (KiB), its stderr and its exit error.
func runMaxRSS(t *testing.T, d time.Duration, argv ...string) (int64, strings.Builder, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	b, _ := json.Marshal(argv)
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(CleanEnv(), maxRSSEnv+"="+string(b))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	kib, perr := strconv.ParseInt(strings.TrimSpace(stdout.String()), 10, 64)
	if perr != nil {
		t.Fatalf("%v: no max RSS from the helper (%v): %q\n%s", argv, err, stdout.String(), stderr.String())
	}
	return kib, stderr, err
}
