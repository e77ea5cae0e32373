package bindtrap

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel ABI of include/uapi/linux/seccomp.h that x/sys/unix lacks.
const (
	ioctlNotifIDValid = 0x40082102 // _IOW('!', 2, __u64)
	ioctlNotifAddFD   = 0x40182103 // _IOW('!', 3, struct seccomp_notif_addfd)
)

// seccompData is struct seccomp_data (64 bytes).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

// notif is struct seccomp_notif (80 bytes).
type notif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

// notifResp is struct seccomp_notif_resp (24 bytes).
type notifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// notifAddFD is struct seccomp_notif_addfd (24 bytes).
type notifAddFD struct {
	ID         uint64
	Flags      uint32
	SrcFD      uint32
	NewFD      uint32
	NewFDFlags uint32
}

// filter is the program: this architecture's bind(2) notifies, every other
// call (and every call of another ABI, such as 32-bit x86) is allowed.
func filter() []unix.SockFilter {
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	return []unix.SockFilter{
		{Code: ldAbs, K: uint32(unsafe.Offsetof(seccompData{}.Arch))},
		{Code: jeq, Jt: 0, Jf: 3, K: auditArch},
		{Code: ldAbs, K: uint32(unsafe.Offsetof(seccompData{}.Nr))},
		{Code: jeq, Jt: 0, Jf: 1, K: unix.SYS_BIND},
		{Code: ret, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
	}
}

// ErrUnsupported is wrapped by Supported's refusal.
var ErrUnsupported = errors.New("bindtrap: this kernel cannot answer a worker's bind")

// Supported reports whether the kernel has what answering a bind needs:
// seccomp user notification (user_notif in
// /proc/sys/kernel/seccomp/actions_avail) and SECCOMP_IOCTL_NOTIF_ADDFD
// (Linux >= 5.9). The error names the fix.
func Supported() error {
	b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	if err != nil {
		return fmt.Errorf("%w: %w (a kernel built with CONFIG_SECCOMP_FILTER is needed; or set bind = \"inherit\" and give the app fd 3)", ErrUnsupported, err)
	}
	if !strings.Contains(string(b), "user_notif") {
		return fmt.Errorf("%w: no user_notif in /proc/sys/kernel/seccomp/actions_avail (Linux >= 5.9 is needed; or set bind = \"inherit\" and give the app fd 3)", ErrUnsupported)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		var major, minor int
		if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err == nil &&
			(major < 5 || major == 5 && minor < 9) {
			return fmt.Errorf("%w: Linux %d.%d lacks SECCOMP_IOCTL_NOTIF_ADDFD (Linux >= 5.9 is needed; or set bind = \"inherit\" and give the app fd 3)", ErrUnsupported, major, minor)
		}
	}
	return nil
}

// install installs the filter on the calling thread and returns the notify
// fd (close-on-exec). Without CAP_SYS_ADMIN the kernel asks for
// no_new_privs first, which is then set: setuid programs the app runs do
// not gain their owner's rights.
func install() (int, error) {
	prog := filter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// WAIT_KILLABLE_RECV (Linux 5.19): once the agent has taken a bind, a
	// signal (Go's preemption, a timer) no longer interrupts and restarts
	// it between the placing of the socket and the answer.
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)
	do := func() (int, error) {
		fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
		if errno == unix.EINVAL && flags&unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV != 0 {
			flags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER // before 5.19: a restarted bind is answered again
			fd, _, errno = unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
	fd, err := do()
	if errors.Is(err, unix.EACCES) {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return -1, fmt.Errorf("prctl PR_SET_NO_NEW_PRIVS: %w", err)
		}
		fd, err = do()
	}
	if err != nil {
		return -1, fmt.Errorf("seccomp filter with a notify fd: %w", err)
	}
	return fd, nil
}
