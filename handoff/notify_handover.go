package handoff

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// File returns a copy of the socket's fd, to pass to the next agent with a
// worker it adopts (the worker keeps its NOTIFY_SOCKET). The caller closes it.
func (s *NotifySocket) File() (*os.File, error) {
	f, err := s.conn.File()
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", s.addr, err)
	}
	return f, nil
}

// SetReadDeadline makes a blocked Serve return (with an error wrapping
// os.ErrDeadlineExceeded) at t: how the agent pauses it for a handoff.
// Datagrams sent meanwhile wait in the socket.
func (s *NotifySocket) SetReadDeadline(t time.Time) error { return s.conn.SetReadDeadline(t) }

// NotifyFromFile is the notify socket that a previous agent passed as f
// (NotifySocket.File). f is not used afterwards: the caller closes it.
func NotifyFromFile(f *os.File) (*NotifySocket, error) {
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("adopted notify socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("adopted notify socket: a %T, not a unix socket", c)
	}
	addr := ""
	if a, ok := uc.LocalAddr().(*net.UnixAddr); ok {
		addr = a.Name
	}
	s := &NotifySocket{conn: uc, addr: addr}
	if addr != "" && addr[0] != '@' {
		s.dir = filepath.Dir(addr) // removed by Close once the adopted worker is gone
		reclaimFolder(s.dir)
	}
	return s, nil
}

// reclaimFolder makes a notify folder that an older agent gave to the
// worker's user the agent's again (mode 0711), so that the worker's
// user can plant nothing more there (best effort: it needs root). dir is
// a name in the agent's base folder: no one else can swap it.
func reclaimFolder(dir string) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) == os.Geteuid() {
		return
	}
	if os.Geteuid() == 0 && unix.Lchown(dir, 0, -1) == nil {
		_ = os.Chmod(dir, 0o711)
	}
}
