package handoff

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxNotifyMessage bounds one sd_notify datagram (systemd uses 4 KiB too).
const MaxNotifyMessage = 4096

// Notify is one parsed sd_notify message: KEY=VALUE lines.
type Notify map[string]string

// ParseNotify parses an sd_notify datagram. Lines without '=' and empty
// keys are ignored; a later key wins. It never fails.
func ParseNotify(b []byte) Notify {
	n := Notify{}
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		k, v, ok := bytes.Cut(line, []byte{'='})
		if !ok || len(k) == 0 {
			continue
		}
		n[string(k)] = string(v)
	}
	return n
}

// NotifySocket receives sd_notify datagrams. The agent opens one per worker,
// so a message is attributed to the worker whose NOTIFY_SOCKET it came in on,
// even when a short-lived child of the worker sent it; the kernel's
// SCM_CREDENTIALS tell the sender's uid, which the agent checks.
type NotifySocket struct {
	conn *net.UnixConn
	addr string
	// dir is the socket's own folder, removed by Close; "" for an abstract
	// socket.
	dir string
	// fallback is why no path socket could be made (nil when it was).
	fallback error
}

// maxSunPath is the room for a socket path in sockaddr_un (108 bytes with
// the terminating NUL).
const maxSunPath = 107

// ListenNotify opens the unixgram socket for one worker's NOTIFY_SOCKET: a
// file path, as systemd's own /run/systemd/notify, because common sd_notify
// clients (Ruby's sd_notify gem, used by Puma) cannot reach abstract
// sockets. The socket is base/<random>/notify, mode 0600, owned by uid when
// uid >= 0 and the agent may chown (root), so only the worker's user (and
// root) can send to it. Its folder stays the agent's (mode 0711: anyone may
// pass through, only the agent may write), so the worker's user cannot
// plant a symlink beside the socket for the root agent to chown or chmod
// through (the health socket, ListenHealth, is bound there later). Close
// removes both. Where no path can be made (base is "", cannot be created,
// or the path is too long for a socket address), it falls back to an
// abstract "@deployd/..." socket and Fallback says why.
func ListenNotify(base string, uid int) (*NotifySocket, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	name := hex.EncodeToString(b[:])
	fallback := errors.New("no notify folder configured")
	if base != "" {
		s, err := listenNotifyPath(base, name, uid)
		if err == nil {
			return s, nil
		}
		fallback = err
	}
	s, err := listenNotifyAt(fmt.Sprintf("@deployd/%d/%s/notify", os.Getpid(), name))
	if err != nil {
		return nil, err
	}
	s.fallback = fallback
	return s, nil
}

// RemoveStaleNotify removes the folders in base whose notify socket no one
// has bound any more (left by an agent that was killed). A socket still
// bound, e.g. one a previous agent handed over with its workers, is kept.
func RemoveStaleNotify(base string) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			os.RemoveAll(dir)
		}
	}
}

// listenNotifyPath makes base/name/notify, owned by uid, in a folder of
// the agent's.
func listenNotifyPath(base, name string, uid int) (*NotifySocket, error) {
	dir := filepath.Join(base, name)
	path := filepath.Join(dir, "notify")
	if len(path) > maxSunPath {
		return nil, fmt.Errorf("notify socket path %s is longer than %d bytes", path, maxSunPath)
	}
	// 0711: workers of other users traverse base, but cannot list it.
	if err := os.MkdirAll(base, 0o711); err != nil {
		return nil, fmt.Errorf("notify folder: %w", err)
	}
	_ = os.Chmod(base, 0o711) // whatever the agent's umask (best effort: base may not be ours)
	// 0700 until the socket is the worker's user's, then 0711 (dir is a
	// fresh name in base, which only the agent writes: no one swaps it).
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("notify folder: %w", err)
	}
	s, err := listenNotifyAt(path)
	if err == nil {
		s.dir = dir
		if err = ownSocket(path, uid); err == nil {
			err = os.Chmod(dir, 0o711)
		}
		if err != nil {
			s.Close()
			err = fmt.Errorf("notify socket %s: %w", path, err)
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// listenNotifyAt binds addr ("@..." is abstract; a path gets mode 0600)
// with SO_PASSCRED on.
func listenNotifyAt(addr string) (*NotifySocket, error) {
	fd, err := bindUnix(unix.SOCK_DGRAM, addr, 0o600)
	if err == nil {
		if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
			unix.Close(fd)
			err = fmt.Errorf("SO_PASSCRED: %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", addr, err)
	}
	f := os.NewFile(uintptr(fd), "notify:"+addr)
	c, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", addr, err)
	}
	conn, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("notify socket %s: a %T, not a unix socket", addr, c)
	}
	return &NotifySocket{conn: conn, addr: addr}, nil
}

// Fallback is why the socket is abstract instead of a path; nil for a
// path socket.
func (s *NotifySocket) Fallback() error { return s.fallback }

// Addr is the value for NOTIFY_SOCKET.
func (s *NotifySocket) Addr() string { return s.addr }

// Serve reads datagrams until Close and calls fn with the sender's pid and
// uid, as the kernel attached them when the datagram was sent (so they are
// right even when the sender has exited since). Datagrams without
// credentials are dropped. Returns nil after Close.
func (s *NotifySocket) Serve(fn func(pid, uid int, msg Notify)) error {
	buf := make([]byte, MaxNotifyMessage)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, flags, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("notify socket: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			continue // over MaxNotifyMessage: dropped, as systemd does
		}
		pid, uid, ok := sender(oob[:oobn])
		if !ok {
			continue
		}
		fn(pid, uid, ParseNotify(buf[:n]))
	}
}

func sender(oob []byte) (pid, uid int, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, 0, false
	}
	for _, m := range msgs {
		if cred, err := unix.ParseUnixCredentials(&m); err == nil {
			return int(cred.Pid), int(cred.Uid), true
		}
	}
	return 0, 0, false
}

// Close stops Serve and removes a path socket and its folder. Safe to
// call twice.
func (s *NotifySocket) Close() error {
	err := s.conn.Close()
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// IPCChannel is the parent's end of a node-ipc channel; the child's end goes
// to the worker as NODE_CHANNEL_FD (what Node's process.send writes to).
type IPCChannel struct {
	Parent *os.File
	Child  *os.File
}

// NewIPCChannel returns a connected unix stream socket pair. The parent's
// end is non-blocking (pollable, so Close ends a pending Read); the child's
// end is blocking, as Node expects.
func NewIPCChannel() (*IPCChannel, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("node-ipc socketpair: %w", err)
	}
	if err := unix.SetNonblock(fds[1], false); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("node-ipc socketpair: %w", err)
	}
	return &IPCChannel{
		Parent: os.NewFile(uintptr(fds[0]), "node-ipc-parent"),
		Child:  os.NewFile(uintptr(fds[1]), "node-ipc-child"),
	}, nil
}
