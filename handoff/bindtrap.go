package handoff

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/deployd/deployd/handoff/bindtrap"
)

// TrapFD is the fd number at which a worker whose binds the agent answers
// (handoff/bindtrap) keeps the notify fd of its bind trap: the shim gets
// the socketpair it sends the notify fd on there, and puts the notify fd
// in its place. Just below the kept files (KeepFD).
const TrapFD = KeepFD - 1

// trapArg is the shim's flag: install the bind trap, send its notify fd
// on the fd that follows.
const trapArg = "--bindtrap"

// shimTrap is the shim's part of the bind trap (fd: TrapFD as a string);
// non-zero is the exit code of a failure, said on stderr. It runs on the
// thread that execs the app (RunShim locks it): the filter is that
// thread's, and the app's after exec.
func shimTrap(fd string) int {
	n, err := strconv.Atoi(fd)
	if err != nil {
		fmt.Fprintf(os.Stderr, "deployd exec: %s %q: %v\n", trapArg, fd, err)
		return 2
	}
	if err := bindtrap.InstallAndSend(n); err != nil {
		fmt.Fprintf(os.Stderr, "deployd exec: the bind trap: %v (set bind = \"inherit\" for this app to start it without, and give it fd 3)\n", err)
		return 126
	}
	return 0
}

// SyscallConn gives the socket to a bind trap's answer without touching
// its flags; a Control after Close fails instead of using a reused number
// (os.File holds the descriptor for the length of a Control call).
func (l *Listener) SyscallConn() (syscall.RawConn, error) {
	l.mu.Lock()
	f := l.file
	l.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("%s %s: %w", l.Network, l.Address, ErrClosed)
	}
	return f.SyscallConn()
}
