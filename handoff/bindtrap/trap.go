package bindtrap

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Trap answers the binds of one worker and everything it starts. Its
// goroutine owns the notify fd; Close ends it. Safe to use concurrently.
type Trap struct {
	f      *os.File
	decide Decide
	log    hclog.Logger
	done   chan struct{}

	mu       sync.Mutex
	answered map[string]int // Decision.Name → binds answered; guarded by mu
	seen     int            // binds seen
}

// Serve answers the binds notified on f (a NotifyFile) with decide until
// Close, or until every process the filter covers has exited.
func Serve(f *os.File, decide Decide, log hclog.Logger) *Trap {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	t := &Trap{f: f, decide: decide, log: log, done: make(chan struct{}), answered: map[string]int{}}
	go t.run()
	return t
}

// Close stops answering and closes the agent's copy of the notify fd (the
// worker keeps its own: its binds then wait for the next agent). It waits
// for the goroutine; safe to call twice.
func (t *Trap) Close() error {
	err := t.f.Close()
	<-t.done
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// Done is closed once the trap stopped answering.
func (t *Trap) Done() <-chan struct{} { return t.done }

// Answered returns how many binds were answered with each socket (by
// Decision.Name), and how many binds were seen in all.
func (t *Trap) Answered() (map[string]int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.answered))
	for k, v := range t.answered {
		out[k] = v
	}
	return out, t.seen
}

func (t *Trap) run() {
	defer close(t.done)
	raw, err := t.f.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n notif
		var rerr error
		hup := false
		err := raw.Read(func(fd uintptr) bool {
			// RECV blocks on an empty queue whatever O_NONBLOCK says: ask
			// poll first, and wait in the netpoller when there is nothing.
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, 0); err != nil || pfd[0].Revents == 0 {
				return false
			}
			if pfd[0].Revents&unix.POLLIN == 0 {
				hup = true // no process left under the filter
				return true
			}
			n = notif{}
			rerr = ioctl(int(fd), unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n))
			return true
		})
		if err != nil || hup {
			return
		}
		if rerr != nil {
			if rerr == unix.ENOENT || rerr == unix.EINTR {
				continue // the caller went away before we took it
			}
			t.log.Warn("seccomp notification receive failed", "error", rerr)
			return
		}
		t.handle(raw, &n)
	}
}

// handle answers one notification.
func (t *Trap) handle(raw syscall.RawConn, n *notif) {
	if n.Data.Nr != unix.SYS_BIND || n.Data.Arch != auditArch {
		t.respond(raw, n.ID, 0) // not ours: let it run
		return
	}
	req, ok, err := readRequest(t.f, n)
	if err != nil {
		if !errors.Is(err, errGone) {
			t.log.Warn("bind not answered: the call runs as asked", "pid", req.PID, "error", err)
			t.respond(raw, n.ID, 0)
		}
		return
	}
	t.mu.Lock()
	t.seen++
	t.mu.Unlock()
	if !ok {
		t.respond(raw, n.ID, 0)
		return
	}
	d := t.decide(req)
	switch {
	case d.Sock != nil:
		if err := t.place(raw, n.ID, req, d.Sock); err != nil {
			t.log.Warn("bind not answered with the agent's socket", "pid", req.PID, "addr", req.String(), "error", err)
			if d.Unused != nil {
				d.Unused()
			}
			return
		}
		t.log.Debug("bind answered", "pid", req.PID, "addr", req.String(), "socket", d.Name)
		t.mu.Lock()
		t.answered[d.Name]++
		t.mu.Unlock()
		if d.Placed != nil {
			d.Placed()
		}
	case d.Errno != 0:
		t.log.Info("bind refused", "pid", req.PID, "addr", req.String(), "errno", d.Errno.Error())
		t.respond(raw, n.ID, d.Errno)
	default:
		t.respond(raw, n.ID, 0)
	}
}

// respond lets the call run (errno 0) or fails it with errno.
func (t *Trap) respond(raw syscall.RawConn, id uint64, errno syscall.Errno) {
	resp := notifResp{ID: id}
	if errno == 0 {
		resp.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
	} else {
		resp.Error = -int32(errno)
	}
	_ = raw.Control(func(fd uintptr) {
		if err := ioctl(int(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp)); err != nil && err != unix.ENOENT {
			t.log.Warn("seccomp answer failed", "error", err)
		}
	})
}

// place puts sock at the caller's fd (ADDFD with SETFD: the caller's own
// socket is closed by the replacement) and answers 0. Not with
// SECCOMP_ADDFD_FLAG_SEND, which would do both in one step but makes the
// call return the new fd's number: glibc callers that test bind's result
// against 0 (the JDK's Net.bind0) then fail with a stale errno.
func (t *Trap) place(raw syscall.RawConn, id uint64, req Request, sock syscall.Conn) error {
	src, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	add := notifAddFD{ID: id, Flags: unix.SECCOMP_ADDFD_FLAG_SETFD, NewFD: uint32(req.FD)}
	cloexec, nonblock := fdFlags(req.PID, req.FD)
	if cloexec {
		add.NewFDFlags = unix.O_CLOEXEC
	}
	var aerr, nerr error
	if err := src.Control(func(sfd uintptr) {
		// O_NONBLOCK belongs to the socket's file description, which every
		// holder shares: it takes the mode the app gave its own socket
		// (SOCK_NONBLOCK in Go, tokio, libuv), which it never sets again
		// after bind. The app's other workers run the same program.
		if nerr = unix.SetNonblock(int(sfd), nonblock); nerr != nil {
			return
		}
		add.SrcFD = uint32(sfd)
		aerr = raw.Control(func(nfd uintptr) {
			aerr = ioctl(int(nfd), ioctlNotifAddFD, unsafe.Pointer(&add))
		})
	}); err != nil {
		return err
	}
	if nerr != nil {
		t.respond(raw, id, unix.EADDRINUSE)
		return fmt.Errorf("O_NONBLOCK: %w", nerr)
	}
	if aerr == unix.ENOENT {
		return nil // the caller went away
	}
	if aerr != nil {
		t.respond(raw, id, unix.EADDRINUSE)
		return fmt.Errorf("SECCOMP_IOCTL_NOTIF_ADDFD: %w", aerr)
	}
	// The fd is the agent's socket now; the bind returns 0. (Were the
	// caller interrupted meanwhile, its restarted bind is answered again.)
	resp := notifResp{ID: id}
	var serr error
	_ = raw.Control(func(fd uintptr) { serr = ioctl(int(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp)) })
	if serr != nil && serr != unix.ENOENT {
		return fmt.Errorf("SECCOMP_IOCTL_NOTIF_SEND: %w", serr)
	}
	return nil
}

// idValid reports whether notification id is still live (errGone if not).
func idValid(f *os.File, id uint64) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var verr error
	if err := raw.Control(func(fd uintptr) { verr = ioctl(int(fd), ioctlNotifIDValid, unsafe.Pointer(&id)) }); err != nil {
		return err
	}
	if verr != nil {
		return fmt.Errorf("%w: %w", errGone, verr)
	}
	return nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}
